#!/usr/bin/env python3
"""Writes the tokenizer fixtures that tests/unit/test_tokenizer.c checks ctrain's tokenizer against.

Trains two small byte-level BPE tokenizers with the Hugging Face `tokenizers` library on the
Debian fortunes corpus and records what the library does with a set of tricky samples:

  tests/fixtures/tokenizers/gpt2/tokenizer.json   GPT-2 style: ByteLevel pre-tokenizer with the
      GPT-2 regex, ByteLevel decoder, vocab 2000, special <|endoftext|>; merges written in the
      old "a b" string format. Extra added tokens to cover the matching rules: "<mask>" (special,
      lstrip and rstrip) and "kitten" (not special, single_word).
  tests/fixtures/tokenizers/qwen/tokenizer.json   Qwen2 style: NFC normalizer, pre-tokenizer
      Sequence[Split(Qwen regex, Isolated), ByteLevel(use_regex=False)], ByteLevel decoder,
      vocab 2000, specials <|endoftext|> <|im_start|> <|im_end|>; merges as [a, b] pairs and
      model.ignore_merges = true. Extra added token "cafe\u0301" (not special, normalized: the
      library matches its NFC form "caf\u00e9" in the normalized text).
  tests/fixtures/tokenizers/expected.json   for every sample: the input bytes (hex), and per
      tokenizer the ids of `encode(text, add_special_tokens=False)` and the bytes (hex) of
      `decode(ids, skip_special_tokens=False)`; for samples without added tokens also the
      pre-tokens (`pre_tokenizer.pre_tokenize_str` of the normalized text, as bytes), which
      show splitting differences that the ids of a small vocabulary would hide.

Invalid UTF-8: a Python str cannot hold it, so the sample with invalid bytes is encoded as
bytes.decode("utf-8", errors="replace") — each maximal invalid subpart becomes one U+FFFD, the
rule ctrain applies to its byte input before normalization.

Regenerate (needs `pip install tokenizers` and the Debian `fortunes` package), from the repo root:
    python3 tools/make_tokenizers.py
Training is deterministic for a given `tokenizers` version; the versions used are printed and
stored in expected.json.

    python3 tools/make_tokenizers.py --unicode-tables
prints the Unicode tables of trainer/tokenizer.c (about a minute): ctrain runs the regexes in
PCRE2 10.42 (Unicode 14) and normalizes with utf8proc 2.6 (Unicode 13), while the library uses
Oniguruma with Unicode 16 tables for its regexes and normalization tables older than Unicode 10.
The tables list, probed from the installed library, what the library's \p{L}, \p{N} and \s
match beyond Unicode 14, and the characters the library leaves alone when normalizing (assigned
after its tables) although newer Unicode normalizes them; ctrain adds the former to its patterns
and normalizes around the latter.
"""
import json
import os
import platform
import random
import sys

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizers")
FORTUNES = "/usr/share/games/fortunes"
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
VOCAB = 2000


def corpus():
    """Fortune documents (text between lines holding only '%'), files in bytewise name order."""
    names = sorted(n for n in os.listdir(FORTUNES)
                   if not n.endswith((".dat", ".u8")) and os.path.isfile(os.path.join(FORTUNES, n)))
    docs = []
    for n in names:
        with open(os.path.join(FORTUNES, n), "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
        docs.extend(d for d in text.split("\n%\n") if d)
    return docs


def train_gpt2(docs):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, show_progress=False,
                                  special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    tok.add_special_tokens([AddedToken("<mask>", special=True, lstrip=True, rstrip=True, normalized=False)])
    tok.add_tokens([AddedToken("kitten", special=False, single_word=True, normalized=False)])
    return tok


def train_qwen(docs):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, show_progress=False,
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    tok.add_tokens([AddedToken("cafe\u0301", special=False, normalized=True)])
    return tok


def save(tok, name, legacy_merges, ignore_merges):
    """Writes DIR/name/tokenizer.json; returns the tokenizer loaded back from that file."""
    data = json.loads(tok.to_str())
    merges = data["model"]["merges"]
    if legacy_merges:
        data["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in merges]
    else:
        data["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in merges]
    data["model"]["ignore_merges"] = ignore_merges
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
        f.write("\n")
    return Tokenizer.from_file(path)


def byte_decoder():
    """The inverse of GPT-2's bytes_to_unicode: byte-level character -> byte."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def pre_tokens(tok, text):
    """The pre-tokens the BPE sees as bytes, or None when the text holds an added token."""
    normalized = tok.normalizer.normalize_str(text) if tok.normalizer else text
    for t in tok.get_added_tokens_decoder().values():
        if t.content in text or t.content in normalized or (tok.normalizer and tok.normalizer.normalize_str(t.content) in normalized):
            return None
    inv = byte_decoder()
    return [bytes(inv[c] for c in piece).hex() for piece, _ in tok.pre_tokenizer.pre_tokenize_str(normalized)]


def samples():
    s = [
        ("english", "Hello, world! This is a test of the tokenizer. The quick brown fox jumps over the lazy dog."),
        ("contractions", "I'm sure you're right, it's what they've said; we'll see, he'd go. DON'T I'M YOU'LL 'S x's"),
        ("digits", "In 1984, 3.14159 and 1,000,000 people; call 555-0123 at 12:30pm. \uff12\uff10\uff12\uff14\u5e74 \u0663\u0664"),
        ("japanese", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002\u6771\u4eac\u306f\u6674\u308c\u3001"
                     "\u6c17\u6e29\u306f\uff12\uff15\u5ea6\u3002\u30ab\u30bf\u30ab\u30ca\u3082\u3072\u3089\u304c\u306a\u3082\u3002"),
        ("japanese_emoji", "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c \U0001F44B\U0001F3FD \u5bff\u53f8\U0001F363"
                           "\u3068\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 \U0001F3F3\uFE0F\u200D\U0001F308 \u2764\uFE0F!"),
        ("emoji_zwj", "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 family, \U0001F44D\U0001F3FD thumbs, "
                      "\U0001F3F3\uFE0F\u200D\U0001F308 flag, \U0001F469\U0001F3FE\u200D\U0001F4BB dev, \U0001F1EF\U0001F1F5 \u2764\uFE0F\U0001F525"),
        ("code_tabs", "def f(x):\n\tif x > 0:\n\t\treturn x  # comment\n\treturn -x\n\nint main(void) {\n    return 0;\n}\n"),
        ("spaces_newlines", "a    b\n\n\n   c  \n \n\t\t  d   \n\n  \t e        "),
        ("crlf", "line one\r\nline two\r\n\r\nend\r  x\r\r\n\n"),
        ("special_tokens", "<|endoftext|>Hello<|endoftext|> world <|im_start|>user\nhi<|im_end|>\n<|endoftext|><|endoftext"),
        ("added_tokens", "a  <mask>  b<mask>c kitten kittens kitten_ xkitten kitten. (kitten) caf\u00e9 cafe\u0301 cafe"),
        ("combining_nfc", "e\u0301cole cafe\u0301 A\u030a n\u0303o \u1e0b\u0323 \u1100\u1161\u11a8 \u0915\u093c \u212b \u2126 fi\ufb01"),
        ("invalid_utf8", b"abc\xff\xfe def \xc3\x28 \xe2\x82 tail \xf0\x9f\x98 x\xed\xa0\x80y \xf4\x90\x80\x80 \xc0\xaf end\x80"),
        ("scripts", "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5. "
                    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645. \u0928\u092e\u0938\u094d\u0924\u0947 "
                    "\u0926\u0941\u0928\u093f\u092f\u093e\u0964 \uc548\ub155\ud558\uc138\uc694 \u4f60\u597d\u4e16\u754c"),
        ("unicode_spaces", "a\u00a0b\u2003c\u3000 d\u0085e\u2028f\u2029g \u200bh\u202f i\u1680j\t\x0b\x0ck \u00a0 \u00a0"),
        ("punctuation", "Well... \"quoted\" -- (parens) [brackets] {braces} @user #tag $5.00 100% a&b c|d ~e ^f `g` \\h"),
        ("nul_and_controls", "a\x00b\x01c\x7f d\x1b[0m"),
        ("long_word", "a" * 300 + " " + "xyz" * 100 + " " + " " * 257 + "!" * 64),
        ("fortune", "A journey of a thousand miles begins with a single step.\n\t\t-- Lao-tsu\n"),
        # characters whose Unicode data differ between the library's tables and PCRE2 / utf8proc
        # (see --unicode-tables): letters and digits of Unicode 15/16, U+180E (no longer a space),
        # marks the library's normalizer does not know (U+0D3C, U+1AC0), a Unicode 13 composition
        ("unicode_versions", "x\u1c89y \ua7cb\U00013460 \U0002ebf0a 1\U00010d40\U00011f50 a\u180e b\u180e\u180e "
                             "\u034a\u0d3c e\u1ac0\u0301 \U00011935\U00011930 \u0d3c\u0301a"),
        ("empty", ""),
    ]
    # Random strings over a pool of characters from many classes, to shake out differences in
    # \s, \p{L}, \p{N}, case folding and NFC between the library and ctrain.
    pool = (list("abcXYZ019 '\t\n\r.,!?-_") + ["'s", "'T", "'ll", "'RE", "  ", "\r\n"] +
            ["\u00e9", "e\u0301", "\u00c5", "A\u030a", "\u017f", "\u212a", "\u0130", "\u00df", "\u0663", "\u00bd",
             "\u2167", "\u00a0", "\u2003", "\u3000", "\u0085", "\u200d", "\ufe0f", "\u3042", "\u6f22", "\uac00",
             "\u1100\u1161", "\U0001F600", "\U0001F44B\U0001F3FD", "\u0915\u094d\u0937", "\u05d0", "\u0627\u064e",
             "<|endoftext|>", "<|im_end|>", "<mask>", "kitten", "cafe\u0301", "\ufb01", "\u2126", "\u00b2", "\u0e01\u0e31"])
    rng = random.Random(1234)
    for i in range(40):
        s.append(("random_%02d" % i, "".join(rng.choice(pool) for _ in range(rng.randint(1, 40)))))
    return s


def ranges(cps):
    r = []
    for cp in cps:
        if r and r[-1][1] == cp - 1:
            r[-1][1] = cp
        else:
            r.append([cp, cp])
    return r


def c_ranges(name, cps, comment):
    lines, line = [], "   "
    for item in ("{0x%04X, 0x%04X}" % (a, b) for a, b in ranges(cps)):
        if len(line) + len(item) + 2 > 100:
            lines.append(line.rstrip())
            line = "   "
        line += " " + item + ","
    lines.append(line.rstrip())
    return "/* %s (%d code points) */\nstatic const uint32_t %s[][2] = {\n%s\n};\n" % (comment, len(cps), name, "\n".join(lines))


def unicode_tables():
    import unicodedata as ud
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    nf = {f: getattr(normalizers, f)() for f in ("NFC", "NFD", "NFKC", "NFKD")}
    letters, numbers, spaces, protect = [], [], [], []
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        cat = ud.category(c)
        # the library's GPT-2 regex: "a"+c is one piece iff c is \p{L} (' ?\p{L}+'), "1"+c iff \p{N},
        # "\t"+c iff \s; the apostrophe would start "'s"-style contractions, so it is no probe
        if c != "'" and len(bl.pre_tokenize_str("a" + c)) == 1:
            if not cat.startswith("L"):
                letters.append(cp)
        elif len(bl.pre_tokenize_str("1" + c)) == 1:
            if not cat.startswith("N"):
                numbers.append(cp)
        elif len(bl.pre_tokenize_str("\t" + c)) == 1:
            spaces.append(cp)
        if cat == "Cn" or (ud.combining(c) == 0 and not ud.decomposition(c)):
            continue
        probes = [c, "a" + c + "\u0334", "a\u0301" + c, "a" + c + "\u0301", c + "\u0334\u0301", "\u1100" + c]
        if any(nf[f].normalize_str(p) != ud.normalize(f, p) for f in nf for p in probes):
            protect.append(cp)
            d = ud.decomposition(c)
            if d and not d.startswith("<"):  # a new precomposed character: its new parts compose too
                parts = "".join(chr(int(x, 16)) for x in d.split())
                if nf["NFC"].normalize_str(parts) != ud.normalize("NFC", parts):
                    protect.extend(ord(p) for p in parts[1:])
    protect = sorted(set(protect))
    print("/* Generated by tools/make_tokenizers.py --unicode-tables with tokenizers %s, Python %s (Unicode %s). */"
          % (tokenizers.__version__, platform.python_version(), ud.unidata_version))
    print(c_ranges("LIB_EXTRA_LETTERS", letters, "\\p{L} in the library, not a letter in Unicode %s" % ud.unidata_version))
    print(c_ranges("LIB_EXTRA_NUMBERS", numbers, "\\p{N} in the library, not a number in Unicode %s" % ud.unidata_version))
    print(c_ranges("LIB_SPACES", spaces, "\\s in the library"))
    print(c_ranges("LIB_NORM_UNKNOWN", protect, "left alone by the library's normalizers, normalized by Unicode %s"
                   % ud.unidata_version))


def main():
    if "--unicode-tables" in sys.argv[1:]:
        return unicode_tables()
    docs = corpus()
    print("corpus: %d documents, %.2f MB" % (len(docs), sum(len(d.encode()) for d in docs) / 1e6))
    toks = {
        "gpt2": save(train_gpt2(docs), "gpt2", legacy_merges=True, ignore_merges=False),
        "qwen": save(train_qwen(docs), "qwen", legacy_merges=False, ignore_merges=True),
    }
    out = {"versions": {"tokenizers": tokenizers.__version__, "python": platform.python_version()},
           "samples": []}
    for name, sample in samples():
        raw = sample if isinstance(sample, bytes) else sample.encode("utf-8")
        text = raw.decode("utf-8", errors="replace")
        entry = {"name": name, "input_hex": raw.hex(), "ids": {}, "decoded_hex": {}, "pieces_hex": {}}
        for tname, tok in toks.items():
            ids = tok.encode(text, add_special_tokens=False).ids
            entry["ids"][tname] = ids
            entry["decoded_hex"][tname] = tok.decode(ids, skip_special_tokens=False).encode("utf-8").hex()
            pieces = pre_tokens(tok, text)
            if pieces is not None:
                entry["pieces_hex"][tname] = pieces
        out["samples"].append(entry)
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    for tname, tok in toks.items():
        print("%s: vocab %d (with added tokens)" % (tname, tok.get_vocab_size(with_added_tokens=True)))
    print("wrote %s/{gpt2,qwen}/tokenizer.json and expected.json (%d samples) with tokenizers %s, Python %s"
          % (OUT, len(out["samples"]), tokenizers.__version__, platform.python_version()))


if __name__ == "__main__":
    sys.exit(main())
