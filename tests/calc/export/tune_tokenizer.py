"""A byte-level tokenizer for running an exported torchtune recipe on a tiny random model: the tokenizer the
config names needs the model's own files (`tune download`), which a test without network has not got. It has
what torchtune's text-completion dataset and its collate read: encode, decode, pad_id, eos_id, bos_id and
max_seq_len."""

from __future__ import annotations


class ByteTokenizer:
    pad_id, bos_id, eos_id = 0, 1, 2
    _first = 3  # the ids of the text's bytes start after the special ones

    def __init__(self, vocab_size: int, max_seq_len: int | None = None) -> None:
        self.vocab_size, self.max_seq_len = vocab_size, max_seq_len

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        span = self.vocab_size - self._first
        ids = [self._first + b % span for b in text.encode("utf-8")]
        return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i - self._first) for i in ids if i >= self._first and i - self._first < 128)


def byte_tokenizer(vocab_size: int, max_seq_len: int | None = None) -> ByteTokenizer:
    return ByteTokenizer(vocab_size, max_seq_len)
