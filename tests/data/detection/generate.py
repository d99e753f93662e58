"""Writes the detection evaluation corpus beside this file, deterministically (seeded), from the default lexicon:

    python tests/data/detection/generate.py

* ``positives.tsv`` (kind, expected lexicon word, text): disguised spellings of default-lexicon words in carrier
  sentences, for every evasion kind. The disguises are made from sources of their own, not from the matcher's
  tables: OpenCC's simplified -> traditional and -> Japanese forms (the matcher folds the other way), a fixed
  list of Cyrillic/Greek look-alikes, leetspeak by hand, pinyin and same-tone homophones from pypinyin's
  readings with jieba's character frequencies, initials, a list of well-known variant and part spellings.
* ``negatives.tsv`` (style, text): ordinary Chinese and English sentences (news-like, chat-like, product
  reviews) from templates and word lists, with near misses (heroine, moneybox, weedkiller, 病毒, 强制 …).

The kinds: plain (the word as it is, separators, full width: what the normaliser always folded), t2s,
variant, confusable, leet, pinyin, homophone, letter, decompose, spelled (a Latin word spelled out letter by
letter: ``c a s i n o``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import opencc
from pypinyin import Style, lazy_pinyin, pinyin
from pypinyin.pinyin_dict import pinyin_dict

from worker_svc.text.lexicon_file import load_lexicon_file

HERE = Path(__file__).parent
SEED = 18

WORDS = [e.word for e in load_lexicon_file()]
CJK_WORDS = [w for w in WORDS if all("\u4e00" <= c <= "\u9fff" for c in w)]
LATIN_WORDS = [w for w in WORDS if w.isascii()]

ZH_CARRIERS = [
    "听说{w}很赚钱，有人一起吗",
    "有没有人知道哪里有{w}",
    "私信我，{w}，价格好说",
    "最新{w}信息请联系客服",
    "{w}，懂的来",
    "朋友推荐的{w}靠谱吗？",
    "本群提供{w}服务，诚信第一",
    "今晚{w}，名额有限",
    "【通知】{w}，详情见置顶",
    "兄弟们，{w}走起",
    "老板说可以{w}，你信吗",
    "这里是{w}的地方吗",
    "{w}",
    "专业{w}，十年老店",
    "欢迎咨询{w}相关业务",
]
EN_CARRIERS = [
    "where can I get {w} tonight",
    "dm me for {w}, fast and discreet",
    "best {w} deals here",
    "{w} available, message me",
    "looking for {w}? we got you",
    "Totally legit {w}!!!",
    "{w}",
    "ask about our {w} today",
    "new {w} offer, no questions asked",
    "contact us: {w} 24/7",
]


def _words(spaced: str) -> list[str]:
    return spaced.split(" ")


def carrier(rng: random.Random, word: str, latin: bool) -> str:
    return rng.choice(EN_CARRIERS if latin else ZH_CARRIERS).format(w=word)


# --- disguises ------------------------------------------------------------------------------------------------

S2T = opencc.OpenCC("s2t")
T2JP = opencc.OpenCC("t2jp")
#: well-known variant forms used to write these characters (not OpenCC's traditional ones)
VARIANT_HAND = {"枪": "鎗", "炮": "砲", "裸": "躶", "博": "愽", "烟": "菸", "药": "葯", "冰": "氷"}
LOOKALIKE = {
    "a": "аα", "c": "сϲ", "e": "е", "i": "іι", "o": "оοσ", "p": "рρ", "s": "ѕ", "x": "хχ", "y": "уγ",
    "k": "кκ", "h": "һ", "j": "ј", "t": "τ", "v": "ν", "n": "η", "m": "м", "b": "Ь", "d": "ԁ",
}  # fmt: skip
LEET = {"a": "4@", "e": "3", "i": "1!", "l": "1|", "o": "0", "s": "5$", "t": "7", "b": "8", "g": "9"}
#: parts of characters, as people write them
PARTS = {
    "枪": "木仓", "炮": "火包", "赌": "贝者", "博": "十尃", "洗": "氵先", "钱": "钅戋", "吗": "口马",
    "啡": "口非", "品": "口口口", "诈": "讠乍", "骗": "马扁", "约": "纟勺", "炸": "火乍", "药": "艹约",
    "裸": "衤果", "聊": "耳卯", "砍": "石欠", "信": "亻言", "加": "力口", "情": "忄青", "球": "王求",
    "机": "木几", "码": "石马", "粉": "米分", "猪": "犭者", "证": "讠正", "敏": "每攵", "词": "讠司",
}  # fmt: skip
SEPARATORS = [" ", ".", "-", "*", "\u200b", "_", "/"]


def t2s_case(rng: random.Random, word: str) -> str | None:
    traditional = S2T.convert(word)
    return traditional if traditional != word else None


def variant_case(rng: random.Random, word: str) -> str | None:
    japanese = T2JP.convert(S2T.convert(word))
    options = []
    if japanese not in (word, S2T.convert(word)):
        options.append(japanese)
    hand = "".join(VARIANT_HAND.get(c, c) for c in word)
    if hand != word:
        options.append(hand)
    return rng.choice(options) if options else None


def confusable_case(rng: random.Random, word: str) -> str | None:
    positions = [i for i, c in enumerate(word) if c.lower() in LOOKALIKE]
    if not positions:
        return None
    chars = list(word)
    for i in rng.sample(positions, min(len(positions), rng.choice((1, 2, 3)))):
        chars[i] = rng.choice(LOOKALIKE[chars[i].lower()])
    return "".join(chars)


def leet_case(rng: random.Random, word: str) -> str | None:
    positions = [i for i, c in enumerate(word) if c in LEET]
    if not positions:
        return None
    chars = list(word)
    for i in rng.sample(positions, min(len(positions), rng.choice((1, 2, 2, 3)))):
        chars[i] = rng.choice(LEET[chars[i]])
    text = "".join(chars)
    return text.upper() if rng.random() < 0.2 else text


def pinyin_case(rng: random.Random, word: str) -> str | None:
    syllables = lazy_pinyin(word)
    style = rng.choice(("whole", "spaced", "one", "one", "capital"))
    if style == "whole":
        return "".join(syllables)
    if style == "spaced":
        return " ".join(syllables)
    if style == "capital":
        return "".join(s.capitalize() for s in syllables)
    i = rng.randrange(len(word))
    return word[:i] + syllables[i] + word[i + 1 :]


def _char_frequencies() -> dict[str, int]:
    freq: dict[str, int] = {}
    for line in resources.files("jieba").joinpath("dict.txt").read_text("utf-8").splitlines():
        fields = line.split(" ")
        if len(fields) >= 2 and len(fields[0]) == 1 and fields[1].isdigit():
            freq[fields[0]] = int(fields[1])
    return freq


FREQ = _char_frequencies()


def _same_sound(ch: str, reading: str) -> list[str]:
    """Common characters (by jieba's frequencies) whose first reading is ``reading``, tone included."""
    found = [
        chr(cp)
        for cp, readings in pinyin_dict.items()
        if 0x4E00 <= cp <= 0x9FFF
        and chr(cp) != ch
        and readings.split(",")[0] == reading
        and FREQ.get(chr(cp), 0) > 2000
    ]
    return sorted(found, key=lambda c: -FREQ[c])[:8]


def homophone_case(rng: random.Random, word: str) -> str | None:
    readings = [p[0] for p in pinyin(word, style=Style.TONE)]
    positions = list(range(len(word)))
    rng.shuffle(positions)
    for i in positions:
        choices = _same_sound(word[i], readings[i])
        if choices:
            return word[:i] + rng.choice(choices) + word[i + 1 :]
    return None


def letter_case(rng: random.Random, word: str) -> str | None:
    if "微" in word and rng.random() < 0.6:
        return word.replace("微", rng.choice("Vv"))
    if len(word) < 3 and not any(c in "炮博赌毒品色情聊约" for c in word):
        return None
    lettered = [k for k, c in enumerate(word) if c in "炮博赌毒品色情聊约"]
    i = lettered[0] if len(word) < 3 else rng.randrange(len(word))
    initial = lazy_pinyin(word[i])[0][0]
    return word[:i] + (initial.upper() if rng.random() < 0.5 else initial) + word[i + 1 :]


def decompose_case(rng: random.Random, word: str) -> str | None:
    positions = [i for i, c in enumerate(word) if c in PARTS]
    if not positions:
        return None
    i = rng.choice(positions)
    return word[:i] + PARTS[word[i]] + word[i + 1 :]


def spelled_case(rng: random.Random, word: str) -> str | None:
    letters = [c for c in word if c != " "]
    if len(letters) > 9:
        return None
    separator = rng.choice([" ", ".", "-", "*", " . "])
    text = separator.join(letters)
    return text.upper() if rng.random() < 0.4 else text


def plain_case(rng: random.Random, word: str) -> str | None:
    style = rng.choice(("as is", "separators", "width"))
    if style == "as is":
        return word
    if style == "width":
        return "".join(_full_width(c) for c in word)
    separator = rng.choice(SEPARATORS)
    return separator.join(word)


def _full_width(c: str) -> str:
    return chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c


KINDS: list[tuple[str, Callable[[random.Random, str], str | None], str, int]] = [
    # kind, how, which words ("cjk", "latin", "all"), how many cases
    ("plain", plain_case, "all", 30),
    ("t2s", t2s_case, "cjk", 40),
    ("variant", variant_case, "cjk", 30),
    ("confusable", confusable_case, "latin", 40),
    ("leet", leet_case, "latin", 40),
    ("pinyin", pinyin_case, "cjk", 40),
    ("homophone", homophone_case, "cjk", 40),
    ("letter", letter_case, "cjk", 30),
    ("decompose", decompose_case, "cjk", 30),
    ("spelled", spelled_case, "latin", 20),
]


def positives(rng: random.Random) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    for kind, how, which, count in KINDS:
        words = {"cjk": CJK_WORDS, "latin": LATIN_WORDS, "all": WORDS}[which]
        cases: list[tuple[str, str, str]] = []
        seen: set[str] = set()
        tries = 0
        while len(cases) < count and tries < count * 50:
            tries += 1
            word = rng.choice(words)
            disguised = how(rng, word)
            if disguised is None:
                continue
            text = carrier(rng, disguised, word.isascii() and kind != "pinyin")
            if text in seen:
                continue
            seen.add(text)
            cases.append((kind, word, text))
        rows += cases
    return rows


# --- negatives ------------------------------------------------------------------------------------------------

ZH = {
    "city": _words("北京 上海 广州 深圳 杭州 成都 武汉 西安 南京 重庆 苏州 天津 长沙 郑州 青岛 厦门"),
    "org": _words("市政府 教育局 气象台 交通委 卫健委 统计局 科技馆 图书馆 博物馆 消防支队 环保局 人民医院"),
    "topic": _words("天气预报 交通管制 招生计划 疫苗接种 垃圾分类 文物保护 旅游数据 就业报告 防汛预案 病毒防控"),
    "detail": [
        "市民可通过官方渠道查询",
        "相关部门将加强监管",
        "预计下周起正式实施",
        "专家建议注意防范流感病毒",
        "活动现场秩序良好",
        "强制执行措施已经落实",
        "冰箱和空调的销量明显上升",
        "照片展览将持续一个月",
        "博士研究生名额有所增加",
        "独步全国的技术引起关注",
        "士兵们完成了演习任务",
        "读博的学生越来越多",
    ],
    "person": _words("小王 老李 妈妈 同事 室友 表哥 老板 班长 张老师 阿姨 小陈 师傅"),
    "time": _words("明天 周末 下午 晚上 国庆节 下周三 月底 过两天"),
    "place": _words("公园 商场 图书馆 电影院 火锅店 博物馆 体育馆 海边 老家 咖啡馆"),
    "activity": _words("逛逛 吃饭 看电影 打球 喝咖啡 拍照片 散步 爬山 买衣服 看展览"),
    "product": _words("手机 耳机 电饭煲 充电宝 冰箱 洗衣机 键盘 台灯 运动鞋 保温杯 空气炸锅 扫地机器人"),
    "quality": _words("质量很好 做工精细 续航一般 声音有点大 物流很快 包装完好 颜色正 性价比高 有点掉色"),
    "opinion": [
        "会推荐给朋友",
        "下次还会回购",
        "客服态度不错",
        "用了一周没问题",
        "和图片描述一致",
        "希望能再便宜点",
        "说明书写得很清楚",
        "杀毒软件也一起装好了",
        "价格5000元左右，值得",
        "iPhone 15 的充电器也能用",
        "支持5G网络和4K视频",
    ],
}
ZH_TEMPLATES = [
    ("news", "{city}{org}今天发布{topic}报告，{detail}。"),
    ("news", "据{city}{org}消息，{topic}工作进展顺利，{detail}。"),
    ("news", "{time}，{city}将举行{topic}发布会，{detail}。"),
    ("chat", "{person}说{time}一起去{place}{activity}吧"),
    ("chat", "{time}有空吗？我们去{place}{activity}，叫上{person}"),
    ("chat", "刚和{person}在{place}{activity}，{detail}"),
    ("review", "这款{product}{quality}，{opinion}。"),
    ("review", "买了{product}给{person}，{quality}，{opinion}"),
    ("review", "{product}收到了，{quality}，{opinion}！"),
]
EN = {
    "city": _words("London Boston Sydney Toronto Denver Dublin Austin Seattle Leeds Scunthorpe Essex Sussex"),
    "org": ["the city council", "the health board", "local police", "the school district", "the museum"],
    "topic": ["road works", "a flu vaccine drive", "the budget", "a new library", "flood defences", "bus routes"],
    "detail": [
        "officials said on Monday",
        "residents welcomed the plan",
        "the heroine of the story is a nurse",
        "the tax-free Moneyball era is over",
        "volunteers handed out weedkiller samples",
        "a moneybox was found in the park",
        "the shop offers a free moneyback guarantee",
        "the heroines of the film were praised",
        "a novocaine shortage hit dentists",
        "analysts expect prices to rise by 5%",
        "the vote passed 7 to 3",
        "the team scored 2 goals in the 4th minute",
        "Essex and Middlesex shared the cup",
        "John's ex-wife was not available for comment",
    ],
    "person": ["my sister", "Tom", "the neighbours", "my boss", "Grandma", "Priya", "the kids", "Alex"],
    "time": ["tomorrow", "on Friday", "this weekend", "tonight", "next week", "at 7pm"],
    "place": ["the park", "the cinema", "a cafe", "the beach", "the gym", "the mall", "Moneyball screening"],
    "activity": ["grab lunch", "watch a movie", "play tennis", "go hiking", "do some shopping", "see the show"],
    "product": ["headphones", "kettle", "phone case", "rice cooker", "desk lamp", "backpack", "Moneybox app"],
    "quality": ["works great", "feels cheap", "arrived quickly", "is well made", "stopped working", "looks nice"],
    "opinion": [
        "would buy again",
        "five stars",
        "not worth the money",
        "my kids love it",
        "the battery lasts 10 hours",
        "great value for 20 bucks",
        "the heroine figure came with it",
        "better than the 3rd-party one",
        "it has 2 USB-C ports and 1 HDMI",
        "I wanted to buy a gunmetal grey one",
        "the therapist recommended it",
    ],
}
EN_TEMPLATES = [
    ("news", "In {city}, {org} announced {topic}; {detail}."),
    ("news", "{org} in {city} will review {topic} {time}, {detail}."),
    ("news", "Update from {city}: {topic} delayed, {detail}."),
    ("chat", "Hey, want to {activity} with {person} {time}?"),
    ("chat", "{person} and I are going to {place} {time}, join us!"),
    ("chat", "lol {person} said we should {activity} {time}"),
    ("review", "The {product} {quality}, {opinion}."),
    ("review", "Bought this {product} for {person}: {quality}. {opinion}!"),
    ("review", "{product} {quality} - {opinion}"),
]


def negatives(rng: random.Random, chinese: int, english: int) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for language, templates, words, count in (("zh", ZH_TEMPLATES, ZH, chinese), ("en", EN_TEMPLATES, EN, english)):
        seen: set[str] = set()
        while len(seen) < count:
            style, template = rng.choice(templates)
            text = template.format(**{k: rng.choice(v) for k, v in words.items()})
            if text[0].islower():
                text = text[0].upper() + text[1:]
            if text not in seen:
                seen.add(text)
                rows.append((f"{language}-{style}", text))
    return rows


def write(folder: Path = HERE) -> tuple[int, int]:
    """Writes positives.tsv and negatives.tsv into ``folder``; how many of each."""
    rng = random.Random(SEED)
    pos = positives(rng)
    neg = negatives(rng, 600, 500)
    with (folder / "positives.tsv").open("w", encoding="utf-8") as out:
        out.write("# generated by tests/data/detection/generate.py: kind, expected lexicon word, text\n")
        out.write("kind\tword\ttext\n")
        for kind, word, text in pos:
            out.write(f"{kind}\t{word}\t{text}\n")
    with (folder / "negatives.tsv").open("w", encoding="utf-8") as out:
        out.write("# generated by tests/data/detection/generate.py: style, text (no lexicon word in any)\n")
        out.write("style\ttext\n")
        for style, text in neg:
            out.write(f"{style}\t{text}\n")
    return len(pos), len(neg)


def main() -> None:
    pos, neg = write()
    print(f"{pos} positives, {neg} negatives")


if __name__ == "__main__":
    main()
