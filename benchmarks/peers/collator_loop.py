"""transformers' DataCollatorForLanguageModeling: pad + mask (15%, 80/10/10) batches of ready sequences."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from transformers import BertTokenizerFast, DataCollatorForLanguageModeling


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", required=True, help=".npz with flat token ids and offsets")
    parser.add_argument("--vocab", required=True)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=512)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = np.load(args.sequences)
    flat, offsets, types = data["tokens"], data["offsets"], data["token_types"]
    features = [{"input_ids": flat[a:b].tolist(), "token_type_ids": types[a:b].tolist()}
                for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    tokenizer = BertTokenizerFast(vocab_file=args.vocab, do_lower_case=True)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=0.15, return_tensors="pt",
                                               pad_to_multiple_of=args.seq_len)
    sequences, started = 0, None
    for first in range(0, len(features) - args.batch_size + 1, args.batch_size):
        batch = collator(features[first: first + args.batch_size])
        assert batch["input_ids"].shape == (args.batch_size, args.seq_len)
        if started is None:
            started = time.perf_counter()
            continue
        sequences += args.batch_size
    seconds = time.perf_counter() - started
    import transformers

    print(json.dumps({"sequences": sequences, "seconds": seconds, "sequences_per_s": sequences / seconds,
                      "versions": {"transformers": transformers.__version__, "torch": torch.__version__}}))


if __name__ == "__main__":
    main()
