#!/usr/bin/env python3
"""Writes the tokenizer reference fixtures under tests/fixtures/tokenizer/.

Runs on a developer machine (not in CI): needs transformers, tokenizers, jinja2 and gguf.

    python3 scripts/make-tokenizer-fixtures.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]

smollm2.json: for a corpus of strings, the ids SmolLM2's tokenizer gives. The tokenizer is
loaded with transformers' GGUF loader (AutoTokenizer.from_pretrained(dir, gguf_file=...)),
which keeps the vocabulary, merges and control tokens of the file but builds a plain GPT-2
ByteLevel pre-tokenizer: transformers has no entry for tokenizer.ggml.pre = "smollm". The real
SmolLM2 tokenizer.json runs Sequence[Digits(individual_digits=true), ByteLevel(use_regex=true)]
(llama.cpp's "smollm" pre-type does the same: split off every \\p{N}, then the GPT-2 regex on
each piece). The two disagree when a run of whitespace precedes a digit ("a   1", "\\n\\n1") and
on a space before a non-ASCII numeric ("  ½"). So each entry records
  ids        the real tokenizer (transformers' GGUF tokenizer with the real pre-tokenizer),
             special tokens matched in the text (parse_special = true),
  ids_plain  the same with special tokens not matched (split_special_tokens=True), only where
             it differs from ids,
  ids_hf_gguf  transformers' GGUF tokenizer unchanged, only where it differs from ids.
The chat section holds apply_chat_template strings (and the same rendered by jinja2 directly
from the GGUF's template string, which must agree).

pretokenize.json: for each pre-tokenizer llmk has a table entry for, the byte lengths of the
pieces the Hugging Face tokenizers pre-tokenizer cuts each string into.
"""
import argparse
import copy
import json
import os
import random

import jinja2
from tokenizers import Regex, pre_tokenizers
from transformers import AutoTokenizer

GPT2_BYTE_LEVEL = dict(add_prefix_space=False, trim_offsets=True, use_regex=True)

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The pre-tokenizers of llmk's table, as Hugging Face tokenizers builds them.
PRE_TOKENIZERS = {
    "gpt2": pre_tokenizers.ByteLevel(**GPT2_BYTE_LEVEL),
    "smollm": pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(**GPT2_BYTE_LEVEL)]
    ),
    "llama3": pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
    "qwen2": pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
}


def handwritten_corpus():
    prose = [
        "Hello world",
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "It was the best of times, it was the worst of times, it was the age of wisdom, it was "
        "the age of foolishness, it was the epoch of belief, it was the epoch of incredulity.",
        "Call me Ishmael. Some years ago—never mind how long precisely—having little or no money "
        "in my purse, and nothing particular to interest me on shore, I thought I would sail about.",
        "Mr. Smith's dog isn't here; they're gone, we've seen it, I'm sure you'll agree, he'd know.",
        "SHOUTING IN ALL CAPS IS NOT NICE!!!",
        "CamelCaseIdentifier and snake_case_identifier and kebab-case-identifier",
        "e.g. i.e. etc. vs. U.S.A. a.m. p.m.",
        "Hyphen-ated words, em—dashes, en–dashes, and ellipses…",
        "\"Quoted\" 'single' “curly” ‘quotes’ «guillemets» „German“",
        "The café served crème brûlée to the naïve señor in Zürich.",
        "Ünïcödé àccénts ëvërywhërë",
        "Straße, Ærøskøbing, Łódź, İstanbul, ĳssel",
    ]
    contractions = [
        "it's", "It's", "IT'S", "it'S", "you're", "YOU'RE", "we'll", "WE'LL", "I've", "I'VE",
        "I'm", "I'M", "he'd", "HE'D", "don't", "DON'T", "'s", "'S", "''s", "'", "''", "'''",
        "rock'n'roll", "o'clock", "the '90s", "'hello'", "dogs' toys", "James's", "JAMES'S",
        "l'amour", "'re're", "'ll've",
    ]
    whitespace = [
        "", " ", "  ", "   ", "    ", "        ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n",
        "\r\n\r\n", " \n", "\n ", " \t \n ", "trailing space ", "trailing spaces   ",
        "  leading spaces", "\tleading tab", "a\tb\tc", "a  b   c    d", "line1\nline2\n",
        "para one.\n\npara two.\n\n\npara three.", "mixed \t \r\n whitespace \u00a0nbsp",
        "\u3000ideographic\u3000space", "en\u2002space em\u2003space thin\u2009space",
        "zero\u200bwidth\u200cnon\u200djoiner", "\u2028line sep\u2029para sep", "\u0085next line",
        "\x0bvertical\x0ctab form feed", "\u180emongolian vowel separator",
        "word \u180e next", " \u180e", "\u180e\u180e",
        "\u1680ogham space", "\u202fnarrow nbsp \u205fmath space", "\u00a0\u00a0x",
        "word \n\n  next", "end\n", "  \n  \n", "\t\n\t\n", " \t",
    ]
    numbers = [
        "0", "1", "12", "123", "1234", "12345", "1234567890", "3.14159", "2.718281828459045",
        "1,000,000", "1 000 000", "-42", "+7", "1e10", "6.02e23", "0x1F", "0b1010", "007",
        "v1.2.3", "2024-05-17", "12:34:56", "$19.99", "€5,00", "100%", "3/4", "1st 2nd 3rd 4th",
        "Room 101", "phone: +1 (555) 123-4567", "a1b2c3", "ABC123def456",
        "123456789012345678901234567890", "a 1", "a  1", "a   1", "x =   5", "\n1", "\n\n1",
        "\t\t2", "    1. item", "  2) second", " 9", "  99", "\u00bd", " \u00bd", "  \u00bd",
        "\u00b2\u00b3", "x\u00b2 + y\u00b2", "\u2162 \u216b", "\u2460\u2461\u2462",
        "\u0661\u0662\u0663 Arabic-Indic", "\u0967\u0968\u0969 Devanagari",
        "\uff11\uff12\uff13 fullwidth", "\u4e00\u4e8c\u4e09 CJK numerals", "\U0001d7ce\U0001d7cf",
    ]
    punctuation = [
        "!", "!!", "!!!", "?!", "...", "…", "---", "-->", "<--", "=>", "->", "::", ";;", "&&",
        "||", "!==", "===", "/* */", "// comment", "# heading", "## subheading", "**bold**",
        "__init__", "@decorator", "#include <stdio.h>", "a+b=c", "(x)", "[[1, 2], [3, 4]]",
        "{\"key\": \"value\", \"n\": [1, 2.5, null]}", "<html><body>hi</body></html>",
        "https://example.com/path?q=1&r=two#frag", "user@example.com", "C:\\Windows\\System32",
        "~/.bashrc", "$HOME/bin:$PATH", "^_^ :-) ;-( <3", "¡Hola! ¿Qué tal?", "«»‹›", "§¶†‡•",
        "\u00a9\u00ae\u2122", "...!?!?...", " . , ; : ", "$$", "%%%", "@@@ ### $$$",
    ]
    code = [
        "def foo(x):\n    return x * 2\n",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
        "    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
        "int main(int argc, char** argv) {\n\tprintf(\"%d\\n\", argc);\n\treturn 0;\n}\n",
        "for (int i = 0; i < 10; ++i) {\n  sum += a[i] * b[i];\n}",
        "class Foo:\n    def __init__(self):\n        self.x = 1\n\n\n    def bar(self):\n"
        "        pass\n",
        "if x:\n\tif y:\n\t\tz()\n\telse:\n\t\tw()\n",
        "    indented four\n        indented eight\n            twelve",
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
        "const f = async (a, b) => { await g(a ?? b); };",
        "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
        "x = [i**2 for i in range(10) if i % 2 == 0]",
        "    \n    \n",
        "#!/bin/bash\nset -euo pipefail\necho \"$1\" | grep -E '^[0-9]+$'\n",
        "\\begin{equation} E = mc^2 \\end{equation}",
        "| col1 | col2 |\n|------|------|\n| a    | b    |",
        "<|im_start|>user\nprint(1)<|im_end|>",
    ]
    scripts = [
        "你好，世界！", "这是一个测试。我们正在测试分词器。", "日本語のテキストとカタカナ ー", "東京は日本の首都です。",
        "한국어 텍스트입니다", "안녕하세요, 세계!", "Россия и Україна", "Привет, мир! Как дела?",
        "Γειά σου Κόσμε", "مرحبا بالعالم", "اللغة العربية جميلة جدا.", "שלום עולם",
        "עברית: אבגד 123", "हिन्दी भाषा", "नमस्ते दुनिया", "ภาษาไทย สวัสดี", "Tiếng Việt có dấu",
        "ქართული ენა", "Հայերեն", "አማርኛ", "ᚠᚢᚦᚨᚱᚲ", "𐌰𐌱𐌲 Gothic", "mixed English 和中文 and العربية",
        "RTL \u202eoverride\u202c and LTR \u200emark",
    ]
    emoji = [
        "😀", "😀😃😄", "👍🏽", "🇺🇸🇫🇷🇯🇵", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "❤️", "❤", "☕ coffee",
        "I ❤️ NY", "emoji😀inside", "🤖 robots 🤖 everywhere 🤖", "1️⃣2️⃣3️⃣", "🧑‍🤝‍🧑", "🫠🫡🫶",
        "✅ done ❌ failed ⚠️ warning",
    ]
    combining = [
        "e\u0301", "cafe\u0301", "n\u0303", "a\u0300\u0301\u0302\u0303\u0304", "Z\u0351\u036b\u0343a\u0310\u0357l\u0344g\u0310o",
        "\u0915\u094d\u0937", "\u0e01\u0e34\u0e4a", "\u05e9\u05c1\u05b8\u05dc\u05d5\u05b9\u05dd",
        "\u0627\u064e\u0644\u0652", "o\u0308\u0332", "\u1100\u1161\u11a8", "\u0301leading mark",
    ]
    special = [
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nHello!<|im_end|>\n",
        "<|im_start|>assistant\n", "<|im_start", "im_start|>", "<|im_end", "<|im_end|", "<|im_end|>>",
        "<<|im_end|>", "< |im_end|>", "<|IM_END|>", "<|im_start|><|im_end|>", "<|im_start|> <|im_end|>",
        "text<|endoftext|>more text", "<|endoftext|><|endoftext|>", " <|endoftext|> ",
        "<repo_name>llmk<file_sep>main.cpp", "<reponame>", "<filename>x.py", "<gh_stars>100",
        "<jupyter_code>print(1)<jupyter_output>1<empty_output>", "<issue_start><issue_comment>",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n",
        "<|unknown_special|>", "<s></s><unk>", "[INST] hi [/INST]", "<|eot_id|>",
        "<|start_header_id|>user<|end_header_id|>",
    ]
    misc = [
        "a", "A", "z", "Z", "ab", "aaaa", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.",
        "supercalifragilisticexpialidocious", "pneumonoultramicroscopicsilicovolcanoconiosis",
        "antidisestablishmentarianism", "The the THE tHe", "AbCdEfGhIjKlMnOpQrStUvWxYz",
        "\u0000", "\u0001\u0002\u0003", "\u007f", "\u0080\u00ff", "\u00ff\u00fe", "\ufeffBOM", "\ufffd",
        "\U0010ffff", "\ue000 private use", "\U0001f600" * 20,
        "word " * 200,
        "x" * 1000,
        "ab" * 500,
        "1" * 300,
        " " * 100,
        "\n" * 50,
        "=" * 80,
        "QmFzZTY0IGVuY29kZWQgdGV4dCB3aXRob3V0IGFueSBzcGFjZXMgYXQgYWxsIGFuZCBxdWl0ZSBsb25n" * 10,
    ]
    groups = [prose, contractions, whitespace, numbers, punctuation, code, scripts, emoji,
              combining, special, misc]
    return [s for g in groups for s in g]


def generated_corpus(seed, count):
    """Random mixtures of fragments that tend to stress the splits: spaces next to digits,
    punctuation next to letters, scripts next to each other."""
    fragments = [
        "the", "The", " cat", "'s", "'S", "'re", "'ll", "n't", " ", "  ", "   ", "\t", "\n",
        "\n\n", "\r\n", "1", "23", "456", "7.5", "½", "²", ",", ".", "!", "?", "...", "(", ")",
        "{", "}", "==", "->", "#", "@", "_", "-", "/", "\\", "\"", "'", "é", "e\u0301", "ß",
        "日本", "中文", "한국", "Россия", "عربى", "עברית", "😀", "👍🏽", "👨‍👩‍👧", "\u00a0",
        "\u3000", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|", "|>", "im_", "<repo_name>",
        "ABC", "xyz", "Hello", " world", "foo_bar", "CamelCase", "\u200b", "\u0300",
    ]
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        n = rng.randint(1, 12)
        out.append("".join(rng.choice(fragments) for _ in range(n)))
    return out


def single_characters():
    """Every ASCII character alone, and a few 2-, 3- and 4-byte ones."""
    return [chr(c) for c in range(128)] + ["\u00e9", "\u00a7", "\u20ac", "\u4e2d", "\U0001f600"]


def chat_conversations():
    return [
        ("one_user", [{"role": "user", "content": "What is the capital of France?"}]),
        ("system_user", [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Hi!"},
        ]),
        ("multi_turn", [
            {"role": "user", "content": "Tell me a joke."},
            {"role": "assistant", "content": "Why did the chicken cross the road?"},
            {"role": "user", "content": "Why?"},
        ]),
        ("system_multi_turn", [
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Bonjour"},
            {"role": "user", "content": "Thanks\nbye"},
        ]),
        ("assistant_first", [
            {"role": "assistant", "content": "How can I help?"},
            {"role": "user", "content": "  spaces  and <|im_end|> inside  "},
        ]),
        ("empty_content", [{"role": "user", "content": ""}]),
        ("late_system", [
            {"role": "user", "content": "a"},
            {"role": "system", "content": "b"},
        ]),
    ]


def real_smollm2(backend):
    """transformers' GGUF tokenizer with the pre-tokenizer of SmolLM2's own tokenizer.json."""
    real = copy.deepcopy(backend)
    real.pre_tokenizer = PRE_TOKENIZERS["smollm"]
    return real


def byte_decoder():
    return {c: b for b, c in bytes_to_unicode().items()}


def piece_lengths(pre_tokenizer, text):
    decoder = byte_decoder()
    lengths = []
    for piece, _ in pre_tokenizer.pre_tokenize_str(text):
        if isinstance(pre_tokenizer, pre_tokenizers.Split):
            lengths.append(len(piece.encode("utf-8")))
        else:  # ByteLevel pieces are spelled in the byte alphabet: one character per byte
            assert all(c in decoder for c in piece)
            lengths.append(len(piece))
    return lengths


def bytes_to_unicode():
    from transformers.convert_slow_tokenizer import bytes_to_unicode as b2u

    return b2u()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=os.path.join(root, "models",
                                                        "SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "tokenizer"))
    args = parser.parse_args()

    tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(args.model)),
                                        gguf_file=os.path.basename(args.model))
    backend = tok.backend_tokenizer
    real = real_smollm2(backend)
    plain = real_smollm2(backend)
    plain.encode_special_tokens = True  # special tokens are not matched in the text
    hf_plain = copy.deepcopy(backend)
    hf_plain.encode_special_tokens = True

    corpus = handwritten_corpus() + single_characters() + generated_corpus(1234, 140)
    seen = set()
    corpus = [s for s in corpus if not (s in seen or seen.add(s))]

    # SmolLM2's vocabulary has no token for some single bytes (six ASCII control characters and
    # lead bytes that valid UTF-8 never or rarely uses). BPE has no unk token, so tokenizers
    # drops those bytes from the output; so does llama.cpp.
    vocab = backend.get_vocab()
    missing = [b for c, b in byte_decoder().items() if c not in vocab]

    cases = []
    differ_hf = 0
    for text in corpus:
        ids = real.encode(text, add_special_tokens=False).ids
        case = {"text": text, "ids": ids}
        ids_plain = plain.encode(text, add_special_tokens=False).ids
        if ids_plain != ids:
            case["ids_plain"] = ids_plain
        ids_hf = tok.encode(text, add_special_tokens=False)
        if ids_hf != ids:
            case["ids_hf_gguf"] = ids_hf
            differ_hf += 1
        # transformers' own split_special_tokens must agree with the backend flag.
        assert tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"] == \
            hf_plain.encode(text, add_special_tokens=False).ids
        # Bytes without a token of their own are dropped (see missing_bytes below).
        assert tok.decode(ids).encode("utf-8") == bytes(b for b in text.encode("utf-8")
                                                        if b not in missing), repr(text)
        cases.append(case)

    template = tok.chat_template
    env = jinja2.Environment()
    chats = []
    for name, messages in chat_conversations():
        for add_generation_prompt in (False, True):
            text = tok.apply_chat_template(messages, tokenize=False,
                                           add_generation_prompt=add_generation_prompt)
            direct = env.from_string(template).render(messages=messages,
                                                      add_generation_prompt=add_generation_prompt)
            assert text == direct, (name, text, direct)
            chats.append({"name": name, "messages": messages,
                          "add_generation_prompt": add_generation_prompt, "text": text})

    smollm2 = {
        "model": os.path.basename(args.model),
        "source": "transformers %s GGUF loader, pre-tokenizer replaced by SmolLM2's "
                  "Sequence[Digits(individual_digits), ByteLevel]" % _version("transformers"),
        "vocab_size": backend.get_vocab_size(),
        "bos_id": tok.convert_tokens_to_ids(tok.bos_token),
        "eos_id": tok.convert_tokens_to_ids(tok.eos_token),
        "chat_template": template,
        "missing_bytes": sorted(missing),
        "cases": cases,
        "chat": chats,
    }
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "smollm2.json"), smollm2)

    pretok = {"source": "tokenizers %s pre_tokenize_str" % _version("tokenizers"),
              "texts": handwritten_corpus(), "splits": {}}
    for name, pre in PRE_TOKENIZERS.items():
        pretok["splits"][name] = [piece_lengths(pre, t) for t in pretok["texts"]]
    write_json(os.path.join(args.out, "pretokenize.json"), pretok)

    print("%d cases (%d where transformers' GGUF tokenizer differs from SmolLM2's), %d chats"
          % (len(cases), differ_hf, len(chats)))


def _version(module):
    import importlib

    return importlib.import_module(module).__version__


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print("wrote %s (%d bytes)" % (path, os.path.getsize(path)))


if __name__ == "__main__":
    main()
