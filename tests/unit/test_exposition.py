"""The Prometheus text format reader (plugins/module_utils/_exposition.py) that the readiness gate
reads an engine's /metrics with: a table of tricky lines, each read as prometheus_client (the
engines' own library, a test dependency here, not on the hosts) reads it, or refused whole where
the reader is stricter on purpose; and a differential fuzz against prometheus_client's parser."""
from __future__ import annotations

import math
import random
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.cleanslate.gpu.plugins.module_utils._exposition import ExpositionError, parse

METADATA = re.compile(r"[ \t]*#[ \t]+(HELP|TYPE)[ \t]")
EM = "\u2003"  # a Unicode space, which Python's \s and str.split take for a blank


def oracle(text):
    """[(name, labels, value, timestamp in ms)] as prometheus_client reads text."""
    return [(sample.name, sample.labels, sample.value,
             None if sample.timestamp is None else round(float(sample.timestamp) * 1000))
            for family in text_string_to_metric_families(text) for sample in family.samples]


def ours(text):
    return [(sample.name, sample.labels, sample.value, sample.timestamp_ms) for sample in parse(text)[0]]


def same(left, right):
    """Equal, NaN equal to NaN."""
    return len(left) == len(right) and all(
        a[:2] == b[:2] and a[3] == b[3] and (a[2] == b[2] or math.isnan(a[2]) and math.isnan(b[2]))
        for a, b in zip(left, right))


READ = [  # (text, what it holds): read so, and so by prometheus_client
    ('a{model_name="x}%s999%s"} 15\n' % (EM, EM), [("a", {"model_name": "x}%s999%s" % (EM, EM)}, 15.0, None)]),
    ('a{model_name="llama}"} 15\n', [("a", {"model_name": "llama}"}, 15.0, None)]),
    ('a{model_name="{"} 1\n', [("a", {"model_name": "{"}, 1.0, None)]),
    ('a{m="q\\"} 999 \\""} 1\n', [("a", {"m": 'q"} 999 "'}, 1.0, None)]),
    ('a{m="back\\\\"} 2\n', [("a", {"m": "back\\"}, 2.0, None)]),
    ('a{m="two\\nlines"} 3\n', [("a", {"m": "two\nlines"}, 3.0, None)]),
    ('a{m="x\u2028y\x85z"} 3\n', [("a", {"m": "x\u2028y\x85z"}, 3.0, None)]),  # not line breaks here
    ('a{m="#"} 3\n', [("a", {"m": "#"}, 3.0, None)]),
    ('a{m=""} 4\n', [("a", {"m": ""}, 4.0, None)]),
    ('a{} 4\n', [("a", {}, 4.0, None)]),
    ('a{x="1",} 5\n', [("a", {"x": "1"}, 5.0, None)]),
    ('a{ x = "1" , y="2" } 5\n', [("a", {"x": "1", "y": "2"}, 5.0, None)]),
    ('vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 1.5e+03\n',
     [("vllm:spec_decode_num_drafts_total", {"engine": "0", "model_name": "m"}, 1500.0, None)]),
    ("a 1E-2\n", [("a", {}, 0.01, None)]),
    ("a .5\n", [("a", {}, 0.5, None)]),
    ("a -0\n", [("a", {}, 0.0, None)]),
    ("a NaN\n", [("a", {}, math.nan, None)]),
    ("a +Inf\n", [("a", {}, math.inf, None)]),
    ("a -Inf\n", [("a", {}, -math.inf, None)]),
    ("a 1e999\n", [("a", {}, math.inf, None)]),
    ("a 7 1712345678901\n", [("a", {}, 7.0, 1712345678901)]),
    ("a 7 -1000\n", [("a", {}, 7.0, -1000)]),
    ("a\t7\t12\n", [("a", {}, 7.0, 12)]),
    ("  a 8\n", [("a", {}, 8.0, None)]),
    ("# HELP a The \\\\ and \\n.\n# TYPE a counter\na_total 9\n", [("a_total", {}, 9.0, None)]),
    ("# just a comment { \" }\n#HELP not metadata\n\na 10\n", [("a", {}, 10.0, None)]),
    ("", []),
]


@pytest.mark.parametrize("text, holds", READ)
def test_a_tricky_line_is_read_as_prometheus_client_reads_it(text, holds):
    assert same(ours(text), holds), ours(text)
    assert same(oracle(text), holds), oracle(text)


def test_help_and_type_are_read_with_their_escapes():
    dummy, metadata = parse("# HELP a One \\\\ two\\nthree\n# TYPE a gauge\na 1\n")
    assert metadata == {"a": {"help": "One \\ two\nthree", "type": "gauge"}}


REFUSED = [  # (text, the reason's words): refused whole, never read as something else; on its line 1 unless said
    ('a{model_name="x"}%s999%s 15\n' % (EM, EM), "not followed by a blank"),  # U+2003 is no blank
    ("a 15%s999\n" % EM, "no number for its value"),
    ('a{model_name="llama} 15\n', "not closed"),  # unclosed: the old regex read 15 as the value
    ('a{m="two\nlines"} 3\n', "not closed"),  # a raw line feed inside a value
    ('a{m="tab\\t"} 1\n', "an escape other than"),  # prometheus_client keeps \t; Prometheus refuses it
    ('a{x="1",x="2"} 1\n', "label x is given twice"),
    ('a{x="1" y="2"} 1\n', "followed by neither , nor }"),
    ("a{x=1} 1\n", "no quoted value"),
    ('a{1x="1"} 1\n', "a label name is expected"),
    ('a{x="1"}1\n', "not followed by a blank"),
    ("a 1 2 3\n", "more than a value and a timestamp"),
    ("a 1 1.5\n", "timestamp that is not an integer"),
    ("a 0x10\n", "no number for its value"),
    ("a 1_000\n", "no number for its value"),  # Python's float() takes it
    ("a\n", "not followed by a blank and a value"),
    ("a 1\r\n", "no number for its value"),  # a carriage return is no blank either
    ("9a 1\n", "a metric name is expected"),
    ("a-b 1\n", "not followed by a blank"),
    ("a 1\na 2\n", "line 3: metric a is given twice with the same labels"),  # a counter repeated would count twice
    ('a{x="1",y="2"} 1\na{y="2",x="1"} 2\n', "line 3: metric a is given twice"),
    ("a 15", "the text does not end with a line feed"),  # cut short: 15 may be the start of 150
    ("# TYPE a foo\na 1\n", "has a # TYPE that is none of"),
    ("# TYPE a gauge\n# TYPE a counter\na 1\n", "line 3: a second # TYPE line"),
    ("# HELP\n", "without a metric name"),
    ("# HELP a bad \\q escape\n", "an escape other than"),
]


@pytest.mark.parametrize("text, why", REFUSED)
def test_a_line_that_breaks_the_format_refuses_the_whole_text_with_its_line_number(text, why):
    body = "ok 1\n" + text  # the good line before it is not returned either
    with pytest.raises(ExpositionError) as refused:
        parse(body)
    message = str(refused.value)
    assert (message.startswith(why) if why.startswith(("line", "the text")) else message.startswith("line 2: ")
            and why in message), message


def test_bytes_must_be_utf8_and_say_where_they_are_not():
    assert ours_bytes('a{m="caf\u00e9"} 1\n'.encode()) == [{"m": "caf\u00e9"}]
    with pytest.raises(ExpositionError, match="byte 9 is not UTF-8"):
        parse(b'a{m="caf\xe9"} 1\n')


def ours_bytes(body):
    return [sample.labels for sample in parse(body)[0]]


def test_the_samples_are_bounded_and_a_huge_line_is_read_in_linear_time():
    parse("".join("a{i=\"%d\"} 1\n" % index for index in range(100)), max_samples=100)
    with pytest.raises(ExpositionError, match="line 101: more than 100 samples"):
        parse("".join("a{i=\"%d\"} 1\n" % index for index in range(101)), max_samples=100)
    huge = 'a{m="%s"} 1\n' % ("\\\\}" * 1000000)  # 3 MB of escapes and braces in one value
    assert parse(huge)[0][0].labels["m"] == "\\}" * 1000000
    with pytest.raises(ExpositionError, match="not closed"):
        parse('a{m="%s} 1\n' % ("x\\\"" * 1000000))  # never closed: refused, without backtracking for ever


def test_a_served_name_inside_a_label_is_data_whatever_it_holds():
    for served in ('x}%s999%s' % (EM, EM), "llama}", '"} 1\nb 2', "a\\", "{{ x }}", "\u00a0%\n$@/"):
        escaped = served.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')  # prometheus_client's
        text = 'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="%s"} 100\n' % escaped
        assert ours(text) == [("vllm:spec_decode_num_draft_tokens_total",
                               {"engine": "0", "model_name": served}, 100.0, None)]
        assert same(oracle(text), ours(text))


ALPHABET = ['a', 'b', '_', ':', '0', '9', '{', '}', '=', ',', '"', '\\', 'n', ' ', '\t', '\n', '#', '.', 'e', '+',
            '-', 'NaN', 'Inf', EM, '\u2028', '\r', 'x="1"', 'y="}"', ' 1', ' 2 3', 'HELP', 'TYPE', 'counter']


def mutated(rng, text):
    """text with a few characters of ALPHABET put in, removed or swapped."""
    chars = list(text)
    for dummy in range(rng.randint(1, 4)):
        where = rng.randrange(len(chars) + 1)
        action = rng.random()
        if action < 0.5:
            chars.insert(where, rng.choice(ALPHABET))
        elif chars and action < 0.8:
            del chars[min(where, len(chars) - 1)]
        elif chars:
            chars[min(where, len(chars) - 1)] = rng.choice(ALPHABET)
    return "".join(chars)


SEEDS = ['# HELP vllm:spec_decode_num_drafts Number of drafts.\n# TYPE vllm:spec_decode_num_drafts counter\n'
         'vllm:spec_decode_num_drafts_total{engine="0",model_name="llama"} 50.0\n',
         'sglang:spec_accept_rate{model_name="x}\u2003999\u2003",tp_rank="0"} 0.15\n',
         'a{m="q\\"\\\\\\n"} 1 1712345678901\nb NaN\n']


@pytest.mark.parametrize("seed", range(3))
def test_whatever_it_reads_prometheus_client_reads_the_same(seed):
    """A differential fuzz: 3000 mutations of real-looking texts. What this reader accepts,
    prometheus_client must accept with the same samples; what it refuses is an ExpositionError,
    never another exception. (`python -m tests.unit.test_exposition N` runs N rounds by hand.)"""
    fuzz(random.Random(seed), 1000)


def fuzz(rng, rounds):
    accepted = 0
    for dummy in range(rounds):
        text = mutated(rng, rng.choice(SEEDS))
        try:
            read = ours(text)
        except ExpositionError:
            continue
        accepted += 1
        try:
            theirs = oracle(text)
        except ValueError:
            # prometheus_client takes "#<any token> TYPE name" for a TYPE line (Prometheus only "# TYPE");
            # such a line is a comment here. Without them it must read the text as this reader does.
            theirs = oracle("\n".join(line for line in text.split("\n") if not line.lstrip(" \t").startswith("#")
                                      or METADATA.match(line)))
        assert same(theirs, read), (text, read, theirs)
    assert accepted > rounds // 20  # the mutations are not all refused: the comparison happened
    return accepted


if __name__ == "__main__":
    import sys
    print("accepted and equal:", fuzz(random.Random(), int(sys.argv[1]) if len(sys.argv) > 1 else 100000))
