/* fuzz_config.c — libFuzzer target: the Hugging Face config.json parser on
 * arbitrary bytes. What it accepts must pass ft_config_validate (every size
 * positive and consistent, epsilon and theta finite and positive). */
#include "model/model.h"

#include <math.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ft_config c;
    if (ft_config_from_hf_text(&c, (const char *)data, size, "fuzz/config.json") != FTUNE_OK) return 0;
    if (ft_config_validate(&c, "fuzz/config.json") != FTUNE_OK) __builtin_trap();
    if (!isfinite(c.norm_eps) || !(c.norm_eps > 0) || !isfinite(c.rope_theta) || c.max_T <= 0) __builtin_trap();
    return 0;
}
