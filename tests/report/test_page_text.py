"""The fast paths the pages are written with say what the plain ones say: orjson's
JSON is the standard library's, values shown in bulk are the values shown one by one,
and the templates read a dict row's keys (dict methods still methods)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from support.synthetic_trace import write_synthetic_trace

from ctracer import analysis
from ctracer.report.pages.site import ReportSite, template_environment
from ctracer.report import timeline as timeline_module
from ctracer.report.jsontext import compact_json, script_safe


def _standard(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def test_compact_json_is_the_standard_librarys_text():
    value = {"fields": ["sk_state", "skc_daddr"], "changes": {2: [0, 4, "0", "1"], 17: []},
             "t": [0, 35156089, 2 ** 63 - 1, -2 ** 63],
             "ms": [0.5, 35.156089, 0.000123, 123456.789],
             "text": ["'x'", "TCP_CLOSE → TCP_SYN_SENT", "a\"b\\c\nd\te\x01", "ü😀"],
             "none": None, "flags": [True, False]}
    assert compact_json(value) == _standard(value)
    assert compact_json({"n": np.int64(7), "x": np.float64(0.25)}) == '{"n":7,"x":0.25}'


def test_compact_json_writes_exponents_shorter_same_numbers():
    tiny = {"t": [1e-06, 2.5e-07, 1e+22]}
    assert compact_json(tiny) == '{"t":[1e-6,2.5e-7,1e+22]}'
    assert json.loads(compact_json(tiny)) == tiny


def test_compact_json_falls_back_where_orjson_refuses():
    wide = {"v": 1 << 70}  # wider than 64 bits: orjson refuses it
    assert compact_json(wide) == _standard(wide) == '{"v":1180591620717411303424}'


def test_script_safe_leaves_no_tag_to_close():
    text = script_safe(compact_json({"comm": "</script><b>&"}))
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"comm": "</script><b>&"}


def test_templates_read_dict_keys_and_dict_methods():
    env = template_environment()
    row = {"name": "sk_state", "items": "a key named items", "count": 3}
    assert env.from_string("{{ r.name }} {{ r.count }}").render(r=row) == "sk_state 3"
    mapping = {"items": 2, "fentry": 1}
    assert env.from_string("{% for k, v in m.items() %}{{ k }}={{ v }};{% endfor %}").render(
        m=mapping) == "items=2;fentry=1;"
    assert env.from_string("{{ r.missing is undefined }}").render(r=row) == "True"


@pytest.mark.parametrize("few", [timeline_module.FEW_VALUES, 0], ids=["looked-up", "by-field"])
def test_values_shown_in_bulk_are_those_shown_one_by_one(tmp_path, monkeypatch, few):
    monkeypatch.setattr(timeline_module, "FEW_VALUES", few)
    path = str(tmp_path / "t.ctrace")
    write_synthetic_trace(path, threads=2, lifecycles=6)
    data = analysis.load(analysis.open_trace(path), lambda _msg: None)
    timeline = ReportSite(data, str(tmp_path / "out"), plots=False).timeline
    ch = data.changes
    assert len(ch) > 50
    bulk = timeline.codes_text(np.concatenate([ch.field, ch.field]),
                               np.concatenate([ch.old, ch.new]))
    # a fresh formatter, so the one-by-one texts are not the bulk call's memo
    fresh = ReportSite(data, str(tmp_path / "out"), plots=False).timeline
    one_by_one = [fresh.code_text(j, c) for j, c in
                  zip(np.concatenate([ch.field, ch.field]).tolist(),
                      np.concatenate([ch.old, ch.new]).tolist())]
    assert bulk == one_by_one
    assert len(set(bulk)) > 5
