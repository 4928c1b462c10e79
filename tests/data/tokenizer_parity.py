"""Tokenizer parity: meshtrain tokenize's ids against tiktoken's and sentencepiece's.

Usage: tokenizer_parity.py MESHTRAIN WORK_DIR
       tokenizer_parity.py bench MESHTRAIN WORK_DIR MB THREADS ROUNDS   (bench/tokenize.sh runs it)

Builds a few MB of varied text deterministically (code, a dozen scripts, whitespace runs, emoji, numbers, long
pieces, special tokens written as text, invalid UTF-8), trains on it a byte-level BPE with Hugging Face
`tokenizers` (saved as tokenizer.json and written in tiktoken's format) and SentencePiece models (BPE with byte
fallback as Llama 2's, and unigram), runs `meshtrain tokenize` with each, and requires the shards' ids to equal
tiktoken's (with Llama 3's, GPT-2's, cl100k_base's and o200k_base's split patterns; encode_ordinary, or
encode(allowed_special="all") with --encode-specials) and sentencepiece's (encode) on the same documents, read by
Python with bytes.decode("utf-8", errors="replace") as meshtrain's --invalid-utf8 replace reads them. `bench` times the same on MB of such text (bench/tokenize.sh says how).
"""
import base64
import json
import os
import random
import resource
import struct
import subprocess
import sys
import time

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
CL100K_PATTERN = (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$"
                  r"|\s*[\r\n]|\s+(?!\S)|\s")  # tiktoken's cl100k_base today: possessive, with $
O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+"])
EOT = "<|endoftext|>"

WORDS = {
    "en": "the quick brown fox jumps over lazy dog machine learning model training data token shard rank "
          "gradient tensor parallel pipeline memory compute network layer attention weight bias loss step "
          "I'm you're they've we'll she'd it's DON'T WON'T Isn't HE'LL o'clock rock'n'roll".split(),
    "de": "Größe Straße über Mädchen schön Fußgänger Übermaß Äpfel Öl zwölf Boxkämpfer jagen Viktor".split(),
    "fr": "été garçon où naïve cœur français Noël hôpital ça déjà l'œuvre aujourd'hui".split(),
    "es": "niño año ¿Qué? ¡Hola! mañana corazón pingüino acción".split(),
    "ru": "привет мир съешь ещё этих мягких французских булок да выпей чаю Ёжик".split(),
    "el": "καλημέρα κόσμε Ελλάδα ξεσκεπάζω ψυχοφθόρα βδελυγμία".split(),
    "ar": "مرحبا بالعالم العربية صِف خَلقَ خَودِ كَمِثلِ الشَمسِ".split(),
    "he": "שלום עולם עברית דג סקרן שט בים".split(),
    "hi": "नमस्ते दुनिया हिन्दी ऋषियों सौ वर्ष क्षत्रिय".split(),
    "zh": "你好 世界 中文 汉字 机器学习 我能吞下玻璃而不伤身体 數據".split(),
    "ja": "こんにちは 世界 カタカナ ひらがな 日本語 いろはにほへと ｶﾀｶﾅ".split(),
    "ko": "안녕하세요 세계 한국어 다람쥐 헌 쳇바퀴에 타고파".split(),
    "th": "สวัสดี ชาวโลก ภาษาไทย เป็นมนุษย์สุดประเสริฐเลิศคุณค่า".split(),
    "vi": "Tiếng Việt người Nước Đẹp ngỡ ngàng".split(),
    "mn": "ᠮᠣᠩᠭᠣᠯ\u180eᠪᠢᠴᠢᠭ ᠬᠡᠯᠡ".split(),
    "misc": "e\u0301 a\u0308 Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇ ﬁ ß ẞ Ω ℃ № ™ ½ ²³ ١٢٣٤ ४२ １２３ 'ſ 'S 'ＳＳ \u200b \ufeff".split(),
}
EMOJI = ["😀", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🇩🇪", "❤️", "🏳️\u200d🌈", "🤖", "🧪", "🙈🙉🙊", "☕"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n\n", " \n ", "\x0b", "\x0c", "\u00a0", "\u1680", "\u2000", "\u2003",
          "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\u0085", "\u180e", "\t\t  \t", "    \n"]
CODE = [
    "#include <stdio.h>\nint main(int argc, char** argv) {\n    for (int i = 0; i < argc; ++i) printf(\"%s\\n\", argv[i]);\n"
    "    return 0; /* done */\n}\n",
    "def f(x, *args, **kwargs):\n\tif x != None and x >= 0x1F:\n\t\treturn [y ** 2 for y in range(x)]  # squares\n"
    "\telse:\n\t\traise ValueError(f'bad {x!r}')\n",
    "const auto it = std::find_if(v.begin(), v.end(), [&](const T& t) -> bool { return t.id == 42; });\n",
    "SELECT name, COUNT(*) FROM users WHERE created_at >= '2026-01-01' GROUP BY name HAVING COUNT(*) > 10;\n",
    "<div class=\"row\"><a href=\"https://example.com/a?b=c&d=e#f\">link</a></div>\n",
    "| col | value |\n|---|---|\n| a | 1.5e-3 |\n",
    "fn main() { let v: Vec<u32> = (0..10).map(|x| x * x).collect(); println!(\"{:?}\", v); }\n",
]


def sentence(rng):
    lang = rng.choice(sorted(WORDS))
    words = [rng.choice(WORDS[lang]) for _ in range(rng.randint(3, 25))]
    out = []
    for w in words:
        r = rng.random()
        if r < 0.08:
            w = w.upper()
        elif r < 0.12:
            w = rng.choice(EMOJI) + w
        elif r < 0.16:
            w = str(rng.randint(0, 10 ** rng.randint(1, 12)))
        elif r < 0.18:
            w = "%.*f" % (rng.randint(1, 6), rng.random() * 1000)
        out.append(w)
        out.append(rng.choice(SPACES) if rng.random() < 0.12 else " ")
    return "".join(out) + rng.choice([".", "!", "?", "...", "。", "؟", "", ":", ";"])


def long_piece(rng):
    kind = rng.randrange(5)
    n = rng.choice([130, 300, 1000])
    if kind == 0:
        return "".join(rng.choice("abcdefghij") for _ in range(n))  # one long letter piece: the heap merge
    if kind == 1:
        return rng.choice(["=", "-", "*", "#", "~", "."]) * n
    if kind == 2:
        return " " * n + rng.choice(["x", "\n", ""])
    if kind == 3:
        return "".join(rng.choice("0123456789") for _ in range(n))
    return "".join(rng.choice(WORDS["zh"]) for _ in range(n // 4))


def document(rng, target):
    parts = []
    size = 0
    while size < target:
        r = rng.random()
        if r < 0.15:
            p = rng.choice(CODE)
        elif r < 0.2:
            p = long_piece(rng)
        elif r < 0.23:
            p = rng.choice([EOT, "<|end_of_text|>", "<|endoftext", "<|begin_of_text|>"])
        elif r < 0.25:
            p = "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 20)))
        else:
            p = sentence(rng)
        parts.append(p)
        parts.append(rng.choice(["\n", "\n\n", " ", "\r\n", "\n  "]))
        size += len(p.encode()) + 1
    return "".join(parts)


INVALID = [b"\xff", b"\xc3\x28", b"\xe2\x82", b"\xed\xa0\x80", b"\xf0\x9f\x98", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\x80"]


def write_corpus(root, total_bytes=4_000_000, seed=1234, big_doc=2_400_000):
    """The corpus under root/corpus; returns its documents' raw bytes in meshtrain's order (sorted paths)."""
    rng = random.Random(seed)
    corpus = os.path.join(root, "corpus")
    os.makedirs(corpus, exist_ok=True)
    docs = {}
    small = total_bytes - big_doc
    i = 0
    while small > 0:
        text = document(rng, rng.choice([200, 2_000, 20_000]))
        raw = text.encode()
        if rng.random() < 0.1:  # invalid UTF-8 here and there
            at = rng.randrange(len(raw) + 1)
            raw = raw[:at] + rng.choice(INVALID) + raw[at:]
        if rng.random() < 0.02:
            raw = b""  # an empty document
        docs[os.path.join(corpus, "txt", "doc%05d.txt" % i)] = [raw]
        small -= len(raw)
        i += 1
    docs[os.path.join(corpus, "txt", "big.txt")] = [document(rng, big_doc).encode()]
    lines = [document(rng, rng.choice([100, 1_000, 5_000])) for _ in range(600)]
    docs[os.path.join(corpus, "lines.jsonl")] = lines
    for path, content in docs.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            if path.endswith(".jsonl"):
                for text in content:
                    f.write(json.dumps({"id": 1, "text": text}, ensure_ascii=rng.random() < 0.5).encode() + b"\n")
            else:
                f.write(content[0])
    texts = []
    for path in sorted(docs):
        if path.endswith(".jsonl"):
            texts.extend(docs[path])
        else:
            texts.append(docs[path][0].decode("utf-8", errors="replace"))
    return corpus, texts


def bytes_to_unicode():
    """GPT-2's map of bytes to the printable characters byte-level BPE vocabularies are written in."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def train_bpe(root, texts, vocab_size=6000):
    """A byte-level BPE trained with Hugging Face tokenizers: tokenizer.json and the same ranks as a tiktoken file."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.save(os.path.join(root, "bpe.json"))
    decode = {c: b for b, c in bytes_to_unicode().items()}
    ranks = {bytes(decode[c] for c in token): rank for token, rank in tok.get_vocab().items()}
    path = os.path.join(root, "bpe.tiktoken")
    with open(path, "w") as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write("%s %d\n" % (base64.b64encode(token).decode(), rank))
    return path, ranks


def train_sentencepiece(root, texts, model_type, vocab_size=4000):
    import sentencepiece as spm
    lines = [line for t in texts[:3000] for line in t.split("\n") if line.strip()]
    random.Random(5).shuffle(lines)
    prefix = os.path.join(root, "sp_" + model_type)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines[:15000]), model_prefix=prefix, model_type=model_type,
                                   vocab_size=vocab_size, byte_fallback=model_type == "bpe", character_coverage=0.9995,
                                   num_threads=2, minloglevel=2, allow_whitespace_only_pieces=True)
    return prefix + ".model"


def read_shards(folder, split="train"):
    ids = []
    names = sorted(n for n in os.listdir(folder) if n.startswith(split + "_") and n.endswith(".bin"))
    for name in names:
        with open(os.path.join(folder, name), "rb") as f:
            data = f.read()
        magic, version, count = struct.unpack("<3i", data[:12])
        width = {(20240520, 1): 2, (20240801, 7): 4}[(magic, version)]
        body = data[1024:]
        assert len(body) == count * width, name
        ids.extend(struct.unpack("<%d%s" % (count, "H" if width == 2 else "I"), body))
    return ids


def tokenize(meshtrain, inputs, out, tokenizer, *flags):
    cmd = [meshtrain, "tokenize", *inputs, "--tokenizer", tokenizer, "--out", out, "--val-fraction", "0",
           "--invalid-utf8", "replace", "--quiet", "--overwrite", *flags]
    start = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.time() - start


def compare(name, got, texts, encode, eot):
    want = []
    starts = []
    for t in texts:
        if not t:
            continue
        starts.append(len(want))
        want.append(eot)
        want.extend(encode(t))
    if got == want:
        print("  %-34s %5d documents, %9d bytes, %8d ids: all equal" % (
            name, len(starts), sum(len(t.encode()) for t in texts), len(want)))
        return True
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    doc = max(d for d, s in enumerate(starts) if s <= first)
    print("FAIL %s: %d ids against %d; first difference at id %d (document %d): got %s, expected %s" % (
        name, len(got), len(want), first, doc, got[first:first + 8], want[first:first + 8]))
    return False


def median(values):
    values = sorted(values)
    return values[len(values) // 2] if len(values) % 2 else (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2


def bench(meshtrain, work, mb, threads, rounds):
    """tokens/s of meshtrain tokenize (the whole command: load, read, tokenize, write shards) against tiktoken's
    encode_ordinary_batch and sentencepiece's encode of a list (text already in memory), on 1 and THREADS threads."""
    import sentencepiece as spm
    import tiktoken
    corpus, texts = write_corpus(work, total_bytes=int(mb * 1e6))
    texts = [t for t in texts if t]
    path, ranks = train_bpe(work, texts[:2000], vocab_size=16000)
    config = os.path.join(work, "bpe_config.json")
    with open(config, "w") as f:
        json.dump({"special_tokens": {EOT: len(ranks)}}, f)  # the Llama 3 pattern
    model = train_sentencepiece(work, texts, "bpe", vocab_size=8000)
    enc = tiktoken.Encoding("bench", pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks, special_tokens={EOT: len(ranks)})
    sp = spm.SentencePieceProcessor(model_file=model)
    out = os.path.join(work, "out")
    sides = {}
    for t in sorted({1, threads}):
        sides[("tiktoken BPE", t, "meshtrain")] = lambda t=t: tokenize(meshtrain, [corpus], out, path, "--tokenizer-config",
                                                                     config, "--threads", str(t))
        sides[("tiktoken BPE", t, "reference")] = lambda t=t: enc.encode_ordinary_batch(texts, num_threads=t)
        sides[("SentencePiece BPE", t, "meshtrain")] = lambda t=t: tokenize(meshtrain, [corpus], out, model, "--threads",
                                                                          str(t))
        sides[("SentencePiece BPE", t, "reference")] = lambda t=t: sp.encode(texts, num_threads=t)
    tokens = {"tiktoken BPE": sum(map(len, enc.encode_ordinary_batch(texts))), "SentencePiece BPE": sum(map(len, sp.encode(texts)))}
    seconds = {key: [] for key in sides}
    cpu = {key: [] for key in sides}

    def cpu_seconds():  # this process's threads and its finished children's
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    for _ in range(rounds):
        for key, run in sides.items():
            start, start_cpu = time.time(), cpu_seconds()
            run()
            seconds[key].append(time.time() - start)
            cpu[key].append(cpu_seconds() - start_cpu)
    text_bytes = sum(len(t.encode()) for t in texts)
    print("%d documents, %.1f MB of text, %d rounds (median), %d cores; tiktoken %s, sentencepiece %s" % (
        len(texts), text_bytes / 1e6, rounds, os.cpu_count(), tiktoken.__version__, spm.__version__))
    print("| tokenizer | threads | ids | meshtrain tokens/s | reference tokens/s | ratio | meshtrain / reference "
          "tokens per CPU second |")
    print("|---|---|---|---|---|---|---|")
    for name in tokens:
        for t in sorted({1, threads}):
            mine = tokens[name] / median(seconds[(name, t, "meshtrain")])
            theirs = tokens[name] / median(seconds[(name, t, "reference")])
            mine_cpu = tokens[name] / median(cpu[(name, t, "meshtrain")])
            theirs_cpu = tokens[name] / median(cpu[(name, t, "reference")])
            print("| %s | %d | %d | %.0f | %.0f | %.2fx | %.0f / %.0f |" % (
                name, t, tokens[name], mine, theirs, mine / theirs, mine_cpu, theirs_cpu))
    return 0


def main():
    if sys.argv[1] == "bench":
        return bench(sys.argv[2], os.path.abspath(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
    meshtrain, work = sys.argv[1], os.path.abspath(sys.argv[2])
    import sentencepiece as spm
    import tiktoken
    started = time.time()
    corpus, texts = write_corpus(work)
    path, ranks = train_bpe(work, texts)
    eot = len(ranks)
    ok = True
    print("tiktoken %s against meshtrain tokenize (a %d-token BPE trained here):" % (tiktoken.__version__, len(ranks)))
    for label, pattern in [("Llama 3 pattern", LLAMA3_PATTERN), ("GPT-2 pattern", GPT2_PATTERN),
                           ("cl100k pattern", CL100K_PATTERN), ("o200k pattern", O200K_PATTERN)]:
        config = os.path.join(work, "bpe_%s.json" % label.split()[0])
        with open(config, "w") as f:
            json.dump({"pattern": pattern, "special_tokens": {EOT: eot}}, f)
        out = os.path.join(work, "out_bpe")
        tokenize(meshtrain, [corpus], out, path, "--tokenizer-config", config)
        enc = tiktoken.Encoding("parity", pat_str=pattern, mergeable_ranks=ranks, special_tokens={EOT: eot})
        ok &= compare(label, read_shards(out), texts, enc.encode_ordinary, eot)
        if pattern == LLAMA3_PATTERN:  # special tokens in the text as their ids
            tokenize(meshtrain, [os.path.join(corpus, "lines.jsonl")], out, path, "--tokenizer-config", config,
                     "--encode-specials")
            lines = [json.loads(line)["text"] for line in open(os.path.join(corpus, "lines.jsonl"), "rb")]
            ok &= compare(label + ", --encode-specials", read_shards(out), lines,
                          lambda t: enc.encode(t, allowed_special="all"), eot)
    print("sentencepiece %s against meshtrain tokenize (models trained here):" % spm.__version__)
    for model_type in ["bpe", "unigram"]:
        model = train_sentencepiece(work, texts, model_type)
        sp = spm.SentencePieceProcessor(model_file=model)
        out = os.path.join(work, "out_sp")
        tokenize(meshtrain, [corpus], out, model)
        ok &= compare("SentencePiece " + model_type, read_shards(out), texts, sp.encode, sp.eos_id())
    print("%s in %.1f s" % ("PASS" if ok else "FAIL", time.time() - started))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
