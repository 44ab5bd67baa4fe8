#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/gemma3.json: Gemma 3's tokenizer (SentencePiece-style BPE with
byte fallback, tokenizer.ggml.model = "llama") as Hugging Face runs it.

Runs on a developer machine (not in CI): needs transformers, tokenizers, jinja2 and gguf.

    python3 scripts/make-gemma-tokenizer-fixtures.py [--model models/gemma-3-270m-q4_k_m.gguf]

The tokenizer is transformers' GGUF loader (AutoTokenizer.from_pretrained(dir, gguf_file=...)).
Each case records
  ids        special tokens matched in the text (parse_special = true), add_special_tokens=False,
  ids_plain  the same with control tokens not matched (split_special_tokens=True), only where it
             differs from ids.
The corpus is SmolLM2's (scripts/make-tokenizer-fixtures.py) plus Gemma-specific strings.

The GGUF carries no tokenizer.chat_template, so the chat section renders Gemma 3's template as
google/gemma-3-*-it ship it in tokenizer_config.json (GEMMA3_CHAT_TEMPLATE below), both with
transformers' apply_chat_template and with jinja2 directly; the two must agree. Conversations
the template rejects (roles not alternating user/model) are recorded with "error": true.
"""
import argparse
import importlib.util
import json
import os
import random

import jinja2
from transformers import AutoTokenizer

# google/gemma-3-*-it tokenizer_config.json "chat_template".
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)


def smollm2_fixture_module():
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "make_tokenizer_fixtures", os.path.join(here, "make-tokenizer-fixtures.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gemma_corpus():
    spaces = [
        " hello", "  hello", "   hello", "hello ", "hello  ", "hello   ", " hello ", "a b", "a  b",
        "a   b", "a" + " " * 31 + "b", "a" + " " * 32 + "b", "a" + " " * 40 + "b", " " * 31,
        " " * 33, " \n", "\n ", " \n ", "\n\n\n\n", "\n" * 31, "\n" * 32, "\n" * 40, "\t", "\t\t",
        "\t" * 31, "\t" * 33, " \t", "\t ", "\t\n\t", "x\ty\tz", "x \t y", "\r", "\r\n\r\n",
        "\u2581", "\u2581\u2581", "a\u2581b", " \u2581 ", "\u2581hello",
    ]
    scripts = [
        "日本語", "中文分词测试：这是一个句子。", "東京都庁", "ひらがなとカタカナ", "한국어 문장입니다.",
        "繁體中文與简体中文", "𠀀𠀁𠀂 CJK extension B", "ｆｕｌｌｗｉｄｔｈ ＡＳＣＩＩ", "ｶﾀｶﾅ",
        "Ελληνικά", "ру́сский", "தமிழ்", "ಕನ್ನಡ", "ગુજરાતી", "ᠮᠣᠩᠭᠣᠯ", "ꦗꦮ", "ߒߞߏ",
    ]
    emoji = [
        "🙂", "🙂🙃", "🫨", "🪿", "🧌", "👩‍🔬", "🧑🏿‍🚀", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "🇯🇵 flag", "emoji 🙂 text",
        "🙂" * 8, "\u2764\ufe0f\u200d\U0001f525",
    ]
    rare = [
        "\U0001d518\U0001d51e", "\U000e0001\U000e0041", "\ue000\uf8ff", "\U000f0000",
        "\U0010fffd", "\u0000\u0001\u001f", "\u007f\u0080\u009f", "\ufdd0", "\ufffe", "\ufeff",
        "\u0378", "\u2fff", "\U0001fbff", "\U0002ebe0", "a\u0000b", "\U0001f0a0\U0001f0df",
        "\u1d2c\u1d2d", "\U00013000 hieroglyph", "\U00010900 phoenician",
    ]
    special = [
        "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "[multimodal]", "<start_of_turn>",
        "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<unused0>", "<unused99>",
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
        "<bos><start_of_turn>user\nHello<end_of_turn>\n", "<start_of_turn", "start_of_turn>",
        "<end_of_turn", "<end_of_turn>>", "<<end_of_turn>", "< start_of_turn>", "<START_OF_TURN>",
        "<start_of_turn><end_of_turn>", " <end_of_turn> ", "text<eos>more", "<bos><bos>",
        "<table><tr><td>1</td></tr></table>", "<table>", "< table>", "<TABLE>", "<table",
        "<h1>Title</h1>", "<b>bold</b> <i>it</i>", "<0x41>", "<0x0A>", "<0x00><0xFF>", "<0x4",
        "<s>", "</s>", "<|im_start|>", "<start_of_image><end_of_image>", "<img>x</img>",
    ]
    mixed = [
        "Hello World", "hello world", "HELLO WORLD", "The year 2025.", "3.14159265358979",
        "user\nmodel\n", "def f():\n\treturn 1\n", "    return x\n", "  \n  \n  ",
        "Gemma is a family of lightweight, state-of-the-art open models.",
        "¿Dónde está la biblioteca?", "Ça va très bien, merci.", "Größenmaßstäbe",
    ]
    return spaces + scripts + emoji + rare + special + mixed


def gemma_generated(seed, count):
    fragments = [
        "the", " cat", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "1", "23", ".", ",", "!",
        "é", "日本", "中文", "😀", "🙂", "\u00a0", "\u3000", "\u2581", "<start_of_turn>",
        "<end_of_turn>", "<bos>", "<eos>", "<table>", "<b>", "<0x41>", "<", ">", "user", "model",
        "Hello", " world", "\U0001d518", "\ue000", "\u0000",
    ]
    rng = random.Random(seed)
    return ["".join(rng.choice(fragments) for _ in range(rng.randint(1, 10)))
            for _ in range(count)]


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
        ("trimmed", [
            {"role": "system", "content": "  untrimmed system  "},
            {"role": "user", "content": "  spaces  and <end_of_turn> inside \n\t "},
            {"role": "assistant", "content": "\n\nreply\n\n"},
        ]),
        ("unicode_whitespace", [
            {"role": "user", "content": "\u3000\u00a0wide\u2003 \u2028"},
        ]),
        ("empty_content", [{"role": "user", "content": ""}]),
        ("only_whitespace", [{"role": "user", "content": " \n "}]),
        ("system_only", [{"role": "system", "content": "Alone."}]),
        ("odd_role", [
            {"role": "user", "content": "a"},
            {"role": "tool", "content": "b"},
        ]),
        ("late_system", [
            {"role": "user", "content": "a"},
            {"role": "system", "content": "b"},
        ]),
        ("assistant_first", [
            {"role": "assistant", "content": "How can I help?"},
            {"role": "user", "content": "hi"},
        ]),
        ("two_users", [
            {"role": "user", "content": "a"},
            {"role": "user", "content": "b"},
        ]),
        ("two_systems", [
            {"role": "system", "content": "a"},
            {"role": "system", "content": "b"},
        ]),
    ]


def render_chats(tok, encode):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.Environment()
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(GEMMA3_CHAT_TEMPLATE)
    chats = []
    for name, messages in chat_conversations():
        for add_generation_prompt in (False, True):
            entry = {"name": name, "messages": messages,
                     "add_generation_prompt": add_generation_prompt}
            try:
                direct = template.render(messages=messages, bos_token=tok.bos_token,
                                         add_generation_prompt=add_generation_prompt)
            except jinja2.exceptions.TemplateError:
                direct = None
            try:
                text = tok.apply_chat_template(messages, chat_template=GEMMA3_CHAT_TEMPLATE,
                                               tokenize=False,
                                               add_generation_prompt=add_generation_prompt)
            except Exception:  # transformers re-raises the template's exception
                text = None
            assert text == direct, (name, text, direct)
            if text is None:
                entry["error"] = True
            else:
                entry["text"] = text
                entry["ids"] = encode(text)
            chats.append(entry)
    return chats


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=os.path.join(root, "models", "gemma-3-270m-q4_k_m.gguf"))
    parser.add_argument("--out", default=os.path.join(root, "tests", "fixtures", "tokenizer"))
    args = parser.parse_args()

    tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(args.model)),
                                        gguf_file=os.path.basename(args.model))
    backend = tok.backend_tokenizer

    smol = smollm2_fixture_module()
    corpus = (smol.handwritten_corpus() + smol.single_characters() + gemma_corpus()
              + smol.generated_corpus(1234, 60) + gemma_generated(4321, 80))
    seen = set()
    corpus = [s for s in corpus if not (s in seen or seen.add(s))]

    def encode(text):
        return tok.encode(text, add_special_tokens=False)

    cases = []
    plain_differs = 0
    for text in corpus:
        ids = encode(text)
        case = {"text": text, "ids": ids}
        ids_plain = tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        if ids_plain != ids:
            case["ids_plain"] = ids_plain
            plain_differs += 1
        # The decoder (▁ -> space, byte fallback, fuse) restores the text exactly, except that
        # a literal U+2581 in the text comes back as a space.
        decoded = backend.decode(ids, skip_special_tokens=False)
        assert decoded == text.replace("\u2581", " "), (text, decoded)
        cases.append(case)

    fixture = {
        "model": os.path.basename(args.model),
        "source": "transformers %s GGUF loader (%s), tokenizers %s" % (
            _version("transformers"), type(tok).__name__, _version("tokenizers")),
        "vocab_size": backend.get_vocab_size(),
        "bos_id": tok.convert_tokens_to_ids(tok.bos_token),
        "eos_id": tok.convert_tokens_to_ids(tok.eos_token),
        "chat_template": GEMMA3_CHAT_TEMPLATE,
        "cases": cases,
        "chat": render_chats(tok, encode),
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gemma3.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print("wrote %s (%d bytes): %d cases (%d with ids_plain), %d chats"
          % (path, os.path.getsize(path), len(cases), plain_differs, len(fixture["chat"])))


def _version(module):
    import importlib

    return importlib.import_module(module).__version__


if __name__ == "__main__":
    main()
