#!/usr/bin/env python3
"""Writes tokenizer.json and tokenizer_config.json into tests/fixtures/families/<family>/ (the
tiny models of scripts/make-family-fixtures.py, whose vocab_size is 512) and the ids the
`tokenizers` library gives for the test corpus to tests/fixtures/tokenizer/families.json.

Runs on a developer machine (not in CI), offline: needs tokenizers (and what
make-tokenizer-json-fixtures.py imports). Never touches config.json, *.safetensors or the
reference files of those folders.

    python3 scripts/make-family-tokenizers.py

Each tokenizer is trained here with the `tokenizers` library on the same small text as the
hf_json fixtures, and shaped like the family's real tokenizer.json, at most 512 tokens in all:
  llama3/  byte-level BPE, Llama 3's Split regex + ByteLevel(use_regex=false), ignore_merges,
           Llama 3.1's special tokens after the vocabulary, bos added by a TemplateProcessing
           post-processor (tokenizer_config.json has no add_bos_token, like the real one);
  qwen2/   byte-level BPE, Qwen2's Split regex, the NFC normalizer, Qwen2.5's added tokens
           (ChatML and vision specials; <tool_call>, </tool_call> and the FIM tokens are not
           special, as in the real file), no bos;
  phi3/    SentencePiece-style BPE as transformers' LlamaConverter writes it (legacy): model
           vocab <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF>, then the pieces;
           byte_fallback, fuse_unk; normalizer Sequence[Prepend("▁"), Replace(" ", "▁")],
           no pre-tokenizer, decoder Sequence[Replace("▁", " "), ByteFallback, Fuse,
           Strip(" ", 1, 0)]; Phi-3's added tokens <|endoftext|> <|assistant|> <|placeholder1-4|>
           <|system|> <|end|> <|placeholder5-6|> <|user|>;
  gemma3/  SentencePiece-style BPE as transformers' GemmaConverter writes it: <pad> <eos> <bos>
           <unk> <mask> and the turn/image tokens in the model vocabulary and as special added
           tokens, the byte tokens, then the pieces; normalizer Replace(" ", "▁"), pre-tokenizer
           Split(" ", merged_with_previous), decoder without Strip; bos added.
Variants of phi3's vocabulary go to tests/fixtures/tokenizer/hf_json/:
  metaspace_first/, metaspace_always/  the shape transformers 5's LlamaTokenizer writes (no
      normalizer; pre-tokenizer Metaspace(prepend_scheme first, or always as for legacy files,
      split false); decoder with Strip);
  phi3_strip/  added tokens that take whitespace along: rstrip on <|user|> <|assistant|>
      <|system|> <|end|> (as later Phi-3 revisions have it), lstrip on <|placeholder1|>, both on
      <|placeholder2|>.
The pieces of the SentencePiece-style ones are learnt with a Metaspace split (word-initial "▁"
pieces, as SentencePiece learns them); the files have no pre-tokenizer, like the real ones.

The chat templates in tokenizer_config.json were transcribed from memory of the files
transformers ships for Llama-3.2-Instruct (Llama 3.1's template), Qwen2.5-Instruct,
Phi-3-mini-4k-instruct and gemma-3-it; they are faithful as far as that memory goes, not
downloaded copies. Likewise bos/eos/pad and add_bos_token.

families.json holds, per family, the vocabulary size and for every corpus string the ids of
tokenizers' encode(add_special_tokens=False): `ids` with added tokens matched, `ids_plain`
(where it differs) with special tokens not matched, `decoded` / `decoded_plain` (where they
differ from the text) tokenizers' decode(skip_special_tokens=False) of those ids.
"""
import importlib.util
import json
import os

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VOCAB = 512  # the families' vocab_size (scripts/make-family-fixtures.py)
SPACE = "\u2581"


def load_script(filename):
    """A sibling script (its name has dashes, so it is not importable by name) as a module."""
    spec = importlib.util.spec_from_file_location(
        filename[:-3].replace("-", "_"), os.path.join(HERE, filename))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


J = load_script("make-tokenizer-json-fixtures.py")
BASE = J.BASE

# ---- chat templates (transcribed; see the docstring): one copy, shared with the chat-template
# fixtures (scripts/make-chat-template-fixtures.py) ----
TEMPLATES = load_script("make-chat-template-fixtures.py")
LLAMA3_TEMPLATE = TEMPLATES.LLAMA32
QWEN25_TEMPLATE = TEMPLATES.QWEN25
PHI3_TEMPLATE = TEMPLATES.PHI3
GEMMA3_TEMPLATE = TEMPLATES.GEMMA3

# ---- special tokens, in id order ----

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
                   "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
                   "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
# (content, special)
QWEN25_ADDED = [(t, True) for t in [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]] + [(t, False) for t in [
        "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
        "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]]
PHI3_HEAD = ["<unk>", "<s>", "</s>"]  # model vocab ids 0..2, also special added tokens
PHI3_ADDED = ["<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>",
              "<|placeholder3|>", "<|placeholder4|>", "<|system|>", "<|end|>",
              "<|placeholder5|>", "<|placeholder6|>", "<|user|>"]
GEMMA3_HEAD = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>",
               "<start_of_image>", "<end_of_image>", "<image_soft_token>"]


def extra_corpus():
    """Strings aimed at these families: their special tokens and lookalikes, byte-token and
    "▁" lookalikes, spaces where SentencePiece-style tokenizers treat them specially."""
    return [
        "<|user|>\nHi<|end|>\n<|assistant|>\n", "<|system|>\nBe brief.<|end|>\n<|user|>\nx<|end|>",
        "<|user|>", "<|end|>", "<|end|", "<|end|>\n<|end|>", "<| end |>", "<|placeholder6|>ok",
        "<s>", "</s>", "<s> </s>", "<s><s>Hi", "x</s>y", "<unk>", "a<unk>b", "<0x0A>", "<0xff>",
        "<0x41><0x42>", SPACE, SPACE + SPACE + "x", " " + SPACE + " ", "a" + SPACE + "b c",
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "<start_of_turn>",
        "<end_of_turn>", "<start_of_turn", "<bos>", "<bos><bos>", "<eos>", "<pad><pad>", "<mask>",
        "<start_of_image><image_soft_token><end_of_image>", "<tool_call>\n{}\n</tool_call>",
        "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", "<|im_start|>user\nx<|im_end|>\n",
        "<|vision_start|><|image_pad|><|vision_end|>", "<|reserved_special_token_0|>",
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", "<|python_tag|>x<|eom_id|>",
        " leading", "  two leading", "trailing ", "trailing  ", " ", "  ", "\t", "\n", " \n ",
        "a  b   c    d", "\u00a0nbsp\u00a0", "x\u3000y",
        " <|placeholder1|> x", "a \t<|placeholder2|>\u3000 b", "<|end|>\u00a0\u2003x\n",
        "<|user|>\n\n  Hi  <|end|>  \n", "x\u200b<|placeholder2|>\u200by", "\n<|placeholder1|>",
    ]


def corpus():
    texts = J.corpus() + extra_corpus()
    seen = set()
    return [s for s in texts if not (s in seen or seen.add(s))]


def byte_level_family(specials, pre, normalizer, ignore_merges, text):
    """A byte-level BPE with `specials` [(content, special)] after the vocabulary."""
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in specials])
    j = json.loads(tok.to_str())
    j["model"]["ignore_merges"] = ignore_merges  # training drops it
    return j


def spm_family(head, added, normalizer, pre, decoder, text):
    """A SentencePiece-style BPE: model vocab = head tokens, the 256 byte tokens, then pieces
    learnt here; `added` special tokens after the vocabulary."""
    learner = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    learner.normalizer = normalizers.Replace(" ", SPACE)
    learner.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="never",
                                                     split=True)
    # Added tokens are cut out of the training text, so that no piece spells one (real
    # vocabularies have none that does).
    for t in head + added:
        text = [line.replace(t, " ") for line in text]
    pieces = VOCAB - len(head) - 256 - len(added)
    trainer = trainers.BpeTrainer(vocab_size=pieces, limit_alphabet=64, show_progress=False)
    learner.train_from_iterator(text, trainer=trainer)
    learnt = json.loads(learner.to_str())["model"]
    assert not any(t in learnt["vocab"] for t in head + added)
    vocab = {t: i for i, t in enumerate(head)}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for piece, _ in sorted(learnt["vocab"].items(), key=lambda kv: kv[1]):
        assert piece not in vocab, piece
        vocab[piece] = len(vocab)
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m)
              for m in learnt["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=True,
                               unk_token="<unk>"))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoder
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in head + added])
    return json.loads(tok.to_str())


def bos_post_processor(j, bos):
    bos_id = next(t["id"] for t in j["added_tokens"] if t["content"] == bos)
    j["post_processor"] = json.loads(processors.TemplateProcessing(
        single="%s $A" % bos, pair="%s $A %s $B" % (bos, bos),
        special_tokens=[(bos, bos_id)]).__getstate__())


def spm_decoder(strip):
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if strip:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    return decoders.Sequence(steps)


def families(text):
    llama3 = byte_level_family(
        [(t, True) for t in LLAMA3_SPECIALS],
        pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(BASE.LLAMA3_SPLIT), behavior="isolated", invert=False),
            J.byte_level(False)]),
        None, True, text)
    bos_post_processor(llama3, "<|begin_of_text|>")
    qwen2 = byte_level_family(
        QWEN25_ADDED,
        pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(BASE.QWEN2_SPLIT), behavior="isolated", invert=False),
            J.byte_level(False)]),
        normalizers.NFC(), False, text)
    phi3 = spm_family(
        PHI3_HEAD, PHI3_ADDED,
        normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)]),
        None, spm_decoder(True), text)
    bos_post_processor(phi3, "<s>")
    gemma3 = spm_family(
        GEMMA3_HEAD, [], normalizers.Replace(" ", SPACE),
        pre_tokenizers.Split(" ", "merged_with_previous"), spm_decoder(False), text)
    bos_post_processor(gemma3, "<bos>")

    configs = {
        "llama3": {
            "bos_token": "<|begin_of_text|>", "clean_up_tokenization_spaces": True,
            "eos_token": "<|eot_id|>", "model_input_names": ["input_ids", "attention_mask"],
            "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast",
            "chat_template": LLAMA3_TEMPLATE},
        "qwen2": {
            "add_prefix_space": False, "bos_token": None, "chat_template": QWEN25_TEMPLATE,
            "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
            "model_max_length": 131072, "pad_token": "<|endoftext|>",
            "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None},
        "phi3": {
            "add_bos_token": False, "add_eos_token": False, "bos_token": "<s>",
            "chat_template": PHI3_TEMPLATE, "clean_up_tokenization_spaces": False,
            "eos_token": "<|endoftext|>", "legacy": False, "model_max_length": 4096,
            "pad_token": "<|endoftext|>", "padding_side": "left", "sp_model_kwargs": {},
            "tokenizer_class": "LlamaTokenizer", "unk_token": "<unk>",
            "use_default_system_prompt": False},
        "gemma3": {
            "add_bos_token": True, "add_eos_token": False, "boi_token": "<start_of_image>",
            "bos_token": "<bos>", "chat_template": GEMMA3_TEMPLATE,
            "clean_up_tokenization_spaces": False, "eoi_token": "<end_of_image>",
            "eos_token": "<eos>", "image_token": "<image_soft_token>",
            "model_max_length": 1000000000000000019884624838656, "pad_token": "<pad>",
            "spaces_between_special_tokens": False, "tokenizer_class": "GemmaTokenizer",
            "unk_token": "<unk>", "use_default_system_prompt": False},
    }
    return {"llama3": llama3, "qwen2": qwen2, "phi3": phi3, "gemma3": gemma3}, configs


def metaspace_variant(phi3, scheme):
    j = json.loads(json.dumps(phi3))
    j["normalizer"] = None
    j["pre_tokenizer"] = json.loads(pre_tokenizers.Metaspace(
        replacement=SPACE, prepend_scheme=scheme, split=False).__getstate__())
    return j


def strip_variant(phi3):
    j = json.loads(json.dumps(phi3))
    for t in j["added_tokens"]:
        c = t["content"]
        t["rstrip"] = c in ("<|user|>", "<|assistant|>", "<|system|>", "<|end|>", "<|placeholder2|>")
        t["lstrip"] = c in ("<|placeholder1|>", "<|placeholder2|>")
    return j


def main():
    out = os.path.join(ROOT, "tests", "fixtures", "families")
    text = J.training_text()
    texts = corpus()
    tokenizers_json, configs = families(text)
    for scheme in ("first", "always"):
        tokenizers_json["metaspace_" + scheme] = metaspace_variant(tokenizers_json["phi3"], scheme)
    tokenizers_json["phi3_strip"] = strip_variant(tokenizers_json["phi3"])
    all_cases = {}
    for name, j in tokenizers_json.items():
        if name.startswith("metaspace_") or name == "phi3_strip":
            path = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "hf_json", name,
                                "tokenizer.json")
            J.write_json(path, j, indent=1)
            written = Tokenizer.from_file(path)
            all_cases[name] = {"vocab_size": written.get_vocab_size(with_added_tokens=True),
                               "cases": J.case_ids(written, texts)}
            continue
        path = os.path.join(out, name, "tokenizer.json")
        J.write_json(path, j, indent=1)
        J.write_json(os.path.join(out, name, "tokenizer_config.json"), configs[name], indent=2)
        written = Tokenizer.from_file(path)
        size = written.get_vocab_size(with_added_tokens=True)
        assert size <= VOCAB, (name, size)
        cases = J.case_ids(written, texts)
        # Without special tokens matched, the way back gives the text, except that NFC
        # normalizes it, and that SentencePiece-style tokenizers read a "▁" in it as a space.
        for c in cases:
            back = c["text"].replace(SPACE, " ") if name in ("phi3", "gemma3") else c["text"]
            if name != "qwen2":
                assert c.get("decoded_plain", c["text"]) == back, (name, c)
        all_cases[name] = {"vocab_size": size, "cases": cases}
    import tokenizers
    J.write_json(os.path.join(ROOT, "tests", "fixtures", "tokenizer", "families.json"),
                 {"source": "tokenizers %s encode(add_special_tokens=False)" % tokenizers.__version__,
                  "tokenizers": all_cases})


if __name__ == "__main__":
    main()
