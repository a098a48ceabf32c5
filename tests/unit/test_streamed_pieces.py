"""A streamed answer's text (trainer/tasks/text_generation/serving.py `Pieces`), token by token,
through real tokenizers: the pieces add up to the whole answer's text, no piece ends inside
a character, and each step decodes a few tokens, not the answer so far."""

from __future__ import annotations

import pytest
import torch

from tests.support.chat_models import CORPUS, FAMILIES, family_tokenizer
from trainer.tasks.text_generation.serving import Pieces

ANSWER = (
    "Paris is the capital of France. 東京 is Japan's 🙂 — naïve café, "
    "two plus two is four!\n\n  Tell me a joke about cats: ∑ 𝄞 ok. " * 6
)


class DecodeSizes:
    """The real tokenizer, recording how many tokens each `decode` was given."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.sizes = tokenizer, []

    def decode(self, ids, **kwargs) -> str:
        self.sizes.append(len(ids))
        return self.tokenizer.decode(ids, **kwargs)


def metaspace_tokenizer():
    """A SentencePiece-style tokenizer (a word's space is a `▁` on its first token, dropped
    from the first token of a decode), as Llama 2's, Mistral's and Gemma's are."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace()
    bpe.decoder = decoders.Metaspace()
    bpe.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"]))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>")


@pytest.mark.parametrize("kind", ["byte-level", "metaspace"])
def test_streamed_pieces_add_up_to_the_answer_each_step_decoding_a_few_tokens(kind):
    if kind == "byte-level":
        tokenizer, text = family_tokenizer(FAMILIES["qwen2"]), ANSWER
    else:
        tokenizer, text = metaspace_tokenizer(), " ".join(CORPUS[:4]).lower() * 4
    ids = [*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id or 0]
    whole = tokenizer.decode(ids, skip_special_tokens=True)
    assert len(ids) > 150 and whole.strip()
    pieces: list[str] = []
    spy = DecodeSizes(tokenizer)
    streamer = Pieces(0, lambda index, piece: pieces.append(piece), spy)
    streamer.put(torch.tensor([5, 6, 7]))  # the prompt: not part of the answer
    for token in ids:
        streamer.put(torch.tensor([token]))
    streamer.end()

    assert "".join(pieces) == whole
    assert not any(piece.endswith("\ufffd") for piece in pieces)
    assert len(pieces) > len(ids) // 4, "the answer came piece by piece, not at the end"
    assert max(spy.sizes) <= 8, f"a step decoded {max(spy.sizes)} of {len(ids)} tokens"


def test_a_streamed_answer_ends_at_its_first_end_of_turn_token_as_the_whole_answer_does():
    """The generation may run on past the end-of-turn token (a model whose generation config
    names none, the tokenizer's ending the answer): the stream ends where the answer does."""
    from trainer.tasks.text_generation.serving import continuation

    tokenizer = family_tokenizer(FAMILIES["qwen2"])
    end = tokenizer.eos_token_id
    said = tokenizer("The answer is four.", add_special_tokens=False)["input_ids"]
    more = tokenizer(" And then it went on.", add_special_tokens=False)["input_ids"]
    pieces: list[str] = []
    streamer = Pieces(0, lambda index, piece: pieces.append(piece), tokenizer, [end])
    streamer.put(torch.tensor([5, 6, 7]))
    for token in [*said, end, *more]:
        streamer.put(torch.tensor([token]))
    streamer.end()
    whole = continuation([*said, end, *more], 3, [end], tokenizer)
    assert "".join(pieces) == whole["text"] == "The answer is four."
