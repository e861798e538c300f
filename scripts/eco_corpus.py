"""eco_corpus.py — a varied text corpus for tokenizer comparisons (imported by
eco_tokenizers.py): code, many scripts, emoji sequences, whitespace runs,
numbers, contractions, and text that looks like special tokens."""

CORPUS = [
    # plain English, contractions (GPT-2's regex has cases for 's 't 're 've 'm 'll 'd)
    "Hello world",
    " Hello world",
    "Once upon a time, there was a little cat named Tom. He didn't know what he'd do; we're sure they'll come, I'm told, you've seen it's true.",
    "DON'T SHOUT! I'M HERE. They'RE late, it'S fine.",
    # code
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <stdio.h>\nint main(void) {\n\tfor (int i = 0; i < 10; ++i) printf(\"%d\\n\", i * i);\n\treturn 0;\n}\n",
    "const x = {a: [1, 2, 3], 'b': null}; // comment\n/* block */ x?.a ?? []; x >>>= 2; a !== b && c || d;",
    "SELECT name, COUNT(*) AS n FROM users WHERE age >= 18 GROUP BY name HAVING n > 1 ORDER BY n DESC;",
    "<html><body class=\"x\"><p>caf&eacute; &amp; cr&egrave;me</p></body></html>",
    "$ git log --oneline | head -n 5 && echo \"done\" > /dev/null 2>&1",
    "https://example.com/path?q=a+b&lang=en#frag user@example.org",
    # numbers
    "0 1 12 123 1234 12345 123456 1234567 12345678901234567890",
    "3.14159 -2.5e-10 1,000,000.00 $19.99 42% 0x1F 0b1010 1e6 2024-11-30 12:34:56",
    "Call 555-0123 or +44 20 7946 0958; order #A1B2C3 ships in 3-5 days.",
    # whitespace runs
    "a  b   c    d     e",
    "tabs\tand\t\tmore\t\t\ttabs",
    "line one\nline two\n\nline four\n\n\n",
    "   leading and trailing   ",
    "windows\r\nline\r\nendings\r\n",
    "\n\n\n   \n\t \n",
    " ",
    "x                                                                y",
    # scripts
    "Ünïcödé façade naïve coöperate Æsir Øresund smörgåsbord Łódź Straße",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "مرحبا بالعالم، كيف حالك؟ ١٢٣",
    "שלום עולם, מה שלומך?",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "你好，世界！我们今天去公园散步吧。",
    "こんにちは世界。カタカナとひらがなと漢字。",
    "안녕하세요 세계! 반갑습니다.",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "ሰላም ለዓለም! ትግርኛ",
    "Ողջույն աշխարհ · გამარჯობა მსოფლიო",
    # emoji: single, ZWJ families, skin tones, flags, keycaps, variation selectors
    "I love pizza 🍕🍕 and 🐈!",
    "👨‍👩‍👧‍👦 family, 👍🏽 thumbs, 🏳️‍🌈 flag, 🇫🇷🇯🇵 flags, 1️⃣ keycap, ❤️ heart",
    "🙂🙃😉😊😇🥰😍🤩😘😗☺️😚😙🥲",
    # symbols and mixed
    "∀x ∈ ℝ: x² ≥ 0 ⇒ √(x²) = |x|; ∑ᵢ aᵢ ≈ ∫ f(t) dt ± ε",
    "«quotes» “curly” ‘single’ — dash – en … ellipsis • bullet © ® ™ ° € £ ¥",
    "mixed日本語English123русский😀end",
    "\u00a0non-breaking\u2009thin\u3000ideographic\u200bzero-width",
    "ａｂｃ１２３ full-width Ａ",
    # decomposed and precomposed forms (an NFC normalizer composes the first of each pair)
    "cafe\u0301 / caf\u00e9, A\u030a / \u00c5, n\u0303 / \u00f1, q\u0323\u0307 s\u0307\u0323, \u212b \u2126",
    "\u1112\u1161\u11ab\u1100\u116e\u11a8\u110b\u1165 / \ud55c\uad6d\uc5b4, \u304b\u3099 \u30cf\u309a",
    # text that looks like special tokens (parsed only where asked)
    "<s> a </s> <unk> <|endoftext|> text",
    "before<|endoftext|>after",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|reserved_special_token_7|>",
]
