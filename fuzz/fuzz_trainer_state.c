/* fuzz_trainer_state.c — libFuzzer target: the checkpoint state parser
 * (trainer_state.json) on arbitrary bytes; what it accepts must satisfy the
 * ranges resume relies on. */
#include "train/train_loop.h"

#include <math.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ft_ckpt_state s;
    if (ft_ckpt_state_parse(&s, (const char *)data, size, "fuzz/trainer_state.json") != FTUNE_OK) return 0;
    if (s.step < 1 || s.data_epoch < 0 || s.data_index < 0 || !s.config) __builtin_trap();
    if (s.n_files < 2 || s.n_files > FT_CKPT_MAX_FILES) __builtin_trap();
    if (s.skipped_steps < 0 || s.skipped_steps > s.step) __builtin_trap();
    if (s.has_scaler && (!(s.scale > 0) || !isfinite(s.scale) || s.growth_interval < 1 || s.growth_tracker < 0 ||
                         s.growth_tracker >= s.growth_interval))
        __builtin_trap();
    for (int i = 0; i < s.n_files; i++)
        if (strchr(s.files[i].name, '/') || !s.files[i].name[0]) __builtin_trap();
    ft_ckpt_state_free(&s);
    return 0;
}
