"""Checks that transformers accepts the quantization_config of bitsandbytes
directories ftune writes, by the path from_pretrained takes: AutoConfig reads
config.json, AutoQuantizationConfig.from_dict builds the BitsAndBytesConfig
(whose post_init type-checks every field), and its to_dict() must give back
every value ftune wrote, with the same JSON type (6.0 stays a float).

usage: bnb_config_check.py nf4|int8 DIR...   (exit 1 naming the file on a failure)

bitsandbytes itself need not be installed: BitsAndBytesConfig's only use of it
is a version check (>= 0.39.0 for 4-bit) after all the type checks; when it is
missing, that check is given the version bitsandbytes 0.39.0 and nothing else
is changed."""
import importlib.metadata
import json
import os
import sys

real_version = importlib.metadata.version


def version(name):
    try:
        return real_version(name)
    except importlib.metadata.PackageNotFoundError:
        if name == "bitsandbytes":
            return "0.39.0"
        raise


importlib.metadata.version = version

from transformers import AutoConfig, BitsAndBytesConfig, logging  # noqa: E402
from transformers.quantizers import AutoQuantizationConfig  # noqa: E402

logging.set_verbosity_error()  # its "Unused kwargs: _load_in_4bit" note is about keys it writes itself
kind, dirs = sys.argv[1], sys.argv[2:]
bad = 0
for d in dirs:
    path = os.path.join(d, "config.json")
    written = json.load(open(path))["quantization_config"]
    try:
        q = AutoQuantizationConfig.from_dict(AutoConfig.from_pretrained(d).quantization_config)
    except Exception as e:  # the TypeError/ValueError transformers raises is the finding
        print("%s: transformers refuses quantization_config: %s: %s" % (path, type(e).__name__, e))
        bad += 1
        continue
    back = json.loads(q.to_json_string(use_diff=False))  # what save_pretrained would write
    diff = [k for k, v in written.items() if k not in back or back[k] != v or type(back[k]) is not type(v)]
    want = {"nf4": (True, False), "int8": (False, True)}[kind]
    if not isinstance(q, BitsAndBytesConfig) or (q.load_in_4bit, q.load_in_8bit) != want or diff:
        print("%s: %s, load_in_4bit %s, load_in_8bit %s; keys that differ after it: %s" % (
              path, type(q).__name__, q.load_in_4bit, q.load_in_8bit,
              ", ".join("%s %r -> %r" % (k, written[k], back.get(k)) for k in diff)))
        bad += 1
        continue
    if kind == "nf4" and not (q.bnb_4bit_quant_type == "nf4" and q.bnb_4bit_use_double_quant):
        print("%s: not nf4 with double quantization: %s" % (path, back))
        bad += 1
        continue
    print("  %s: BitsAndBytesConfig accepts it (%s, llm_int8_threshold %r)" % (path, kind, q.llm_int8_threshold))
sys.exit(1 if bad else 0)
