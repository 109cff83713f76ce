"""The Go text/template subset used by containerd's CNI ``conf_template``."""

# The GCE template below is quoted verbatim, long lines included.
# ruff: noqa: E501

from __future__ import annotations

import json
from typing import Any

import pytest

from pycrid.network.template import TemplateError, render

# containerd's contrib/gce/cni.template
GCE_TEMPLATE = """\
{
  "name": "k8s-pod-network",
  "cniVersion": "1.0.0",
  "plugins": [
    {
      "type": "ptp",
      "mtu": 1460,
      "ipam": {
        "type": "host-local",
        "ranges": [{{range $i, $range := .PodCIDRRanges}}{{if $i}}, {{end}}[{"subnet": "{{$range}}"}]{{end}}],
        "routes": [{{range $i, $route := .Routes}}{{if $i}}, {{end}}{"dst": "{{$route}}"}{{end}}]
      }
    },
    {
      "type": "portmap",
      "capabilities": {
        "portMappings": true
      }
    }
  ]
}
"""


def _gce(ranges: list[str], routes: list[str]) -> tuple[str, dict[str, Any]]:
    data = {"PodCIDR": ranges[0], "PodCIDRRanges": ranges, "Routes": routes}
    text = render(GCE_TEMPLATE, data)
    return text, json.loads(text)


def test_gce_template_dual_stack() -> None:
    text, conf = _gce(["10.1.0.0/24", "fd00:1::/64"], ["0.0.0.0/0", "::/0"])
    ipam = conf["plugins"][0]["ipam"]
    assert ipam["ranges"] == [[{"subnet": "10.1.0.0/24"}], [{"subnet": "fd00:1::/64"}]]
    assert ipam["routes"] == [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]
    assert conf["plugins"][1] == {"type": "portmap", "capabilities": {"portMappings": True}}
    assert '"ranges": [[{"subnet": "10.1.0.0/24"}], [{"subnet": "fd00:1::/64"}]],' in text


def test_gce_template_single_range() -> None:
    text, conf = _gce(["10.1.0.0/24"], ["0.0.0.0/0"])
    ipam = conf["plugins"][0]["ipam"]
    assert ipam["ranges"] == [[{"subnet": "10.1.0.0/24"}]]
    assert ipam["routes"] == [{"dst": "0.0.0.0/0"}]
    assert '"ranges": [[{"subnet": "10.1.0.0/24"}]],' in text
    assert '"routes": [{"dst": "0.0.0.0/0"}]\n' in text


def test_gce_template_no_routes() -> None:
    _, conf = _gce(["10.1.0.0/24"], [])
    assert conf["plugins"][0]["ipam"]["routes"] == []


def test_plain_text_and_comments() -> None:
    assert render("no actions {here}", {}) == "no actions {here}"
    assert render("a{{/* a comment */}}b", {}) == "ab"
    assert render("a {{- /* multi\nline */ -}} b", {}) == "ab"
    assert render("", {}) == ""


def test_trim_markers() -> None:
    data = {"A": "x"}
    assert render("a  \n\t{{- .A -}}  \n b", data) == "axb"
    assert render("a  {{- .A}}  b", data) == "ax  b"
    assert render("a  {{.A -}}  \n b", data) == "a  xb"
    # "-" without a following space is not a trim marker.
    assert render("a {{-3}} b", {}) == "a -3 b"
    text = '[\n{{- range .L}}\n  "{{.}}",\n{{- end}}\n]'
    assert render(text, {"L": ["a", "b"]}) == '[\n  "a",\n  "b",\n]'


def test_fields_dot_and_variables() -> None:
    data = {"PodCIDR": "10.1.0.0/24", "Net": {"MTU": 1460}}
    assert render("{{.PodCIDR}}", data) == "10.1.0.0/24"
    assert render("{{.Net.MTU}}", data) == "1460"
    assert render("{{$.PodCIDR}} {{$}}", {"PodCIDR": "c"}) == "c map[PodCIDR:c]"
    assert render("{{$x := .PodCIDR}}[{{$x}}]", data) == "[10.1.0.0/24]"


def test_printing_values() -> None:
    data = {"S": "s", "I": 42, "T": True, "F": False, "L": ["a", 1, True], "E": [], "N": None}
    out = render("{{.S}} {{.I}} {{.T}} {{.F}} {{.L}} {{.E}} {{.N}}", data)
    assert out == "s 42 true false [a 1 true] [] <nil>"
    assert render('{{"lit"}} {{`raw\\n`}} {{7}} {{true}}', {}) == "lit raw\\n 7 true"


def test_range_forms_and_else() -> None:
    data = {"L": ["a", "b", "c"], "E": []}
    assert render("{{range .L}}<{{.}}>{{end}}", data) == "<a><b><c>"
    assert render("{{range $x := .L}}{{$x}}{{end}}", data) == "abc"
    assert render("{{range $i, $x := .L}}{{$i}}={{$x}};{{end}}", data) == "0=a;1=b;2=c;"
    assert render("{{range .E}}x{{else}}empty{{end}}", data) == "empty"
    assert render("{{range .L}}{{.}}{{else}}empty{{end}}", data) == "abc"
    assert render("{{range $k, $v := .M}}{{$k}}:{{$v}} {{end}}", {"M": {"b": 2, "a": 1}}) == (
        "a:1 b:2 "
    )


def test_if_else_if_else() -> None:
    text = '{{if eq .N 1}}one{{else if eq .N 2}}two{{else if .Big}}big{{else}}other{{end}}'
    assert render(text, {"N": 1, "Big": False}) == "one"
    assert render(text, {"N": 2, "Big": False}) == "two"
    assert render(text, {"N": 3, "Big": True}) == "big"
    assert render(text, {"N": 3, "Big": False}) == "other"
    assert render("{{if .A}}yes{{end}}", {"A": "x"}) == "yes"


@pytest.mark.parametrize("value", [False, 0, "", [], {}, None])
def test_go_falsy_values(value: object) -> None:
    assert render("{{if .V}}T{{else}}F{{end}}", {"V": value}) == "F"


@pytest.mark.parametrize("value", [True, 1, -1, "0", ["x"], {"k": "v"}])
def test_go_truthy_values(value: object) -> None:
    assert render("{{if .V}}T{{else}}F{{end}}", {"V": value}) == "T"


def test_functions() -> None:
    data = {"L": ["a", "b"], "S": "héllo", "M": {"k": "v"}, "E": []}
    assert render("{{len .L}} {{len .S}} {{len .M}} {{len .E}}", data) == "2 6 1 0"
    assert render("{{index .L 1}} {{index .M \"k\"}} {{index .L}}", data) == "b v [a b]"
    assert render('{{if eq .S "héllo"}}eq{{end}}{{if ne (len .L) 3}} ne{{end}}', data) == "eq ne"
    assert render('{{if eq "b" "a" "b"}}any{{end}}', {}) == "any"
    assert render("{{not .E}} {{not .L}}", data) == "true false"
    out = render("{{and .L .S}} {{and .E .S}} {{or .E .S}} {{or .E 0}}", data)
    assert out == "héllo [] héllo 0"
    assert render("{{if and (eq (len .L) 2) (not .E)}}ok{{end}}", data) == "ok"
    assert render("{{index .L 0}}x", data) == "ax"


def test_nested_ranges_and_scoping() -> None:
    data = {"Outer": [{"Name": "n1", "In": [1, 2]}, {"Name": "n2", "In": [3]}], "Sep": "/"}
    text = (
        "{{range $o := .Outer}}{{range $i, $v := .In}}"
        "{{$o.Name}}{{$.Sep}}{{$i}}{{$.Sep}}{{$v}} {{end}}{{end}}"
    )
    assert render(text, data) == "n1/0/1 n1/1/2 n2/0/3 "
    # Dot is the element inside range; $ stays the root.
    assert render("{{range .L}}{{.}}{{$.X}}{{end}}", {"L": ["a", "b"], "X": "!"}) == "a!b!"
    # A variable declared inside a range body is fresh on each iteration.
    assert render("{{range .L}}{{$y := .}}{{$y}}{{end}}", {"L": [1, 2]}) == "12"


def test_variable_out_of_scope_is_an_error() -> None:
    with pytest.raises(TemplateError, match=r"undefined variable '\$x'"):
        render("{{range $x := .L}}{{end}}{{$x}}", {"L": []})
    with pytest.raises(TemplateError, match=r"line 1: undefined variable '\$y' in {{\$y}}"):
        render("{{if .A}}{{$y := 1}}{{end}}{{$y}}", {"A": True})
    with pytest.raises(TemplateError, match=r"undefined variable '\$nope'"):
        render("{{$nope}}", {})


@pytest.mark.parametrize(
    ("text", "data", "fragments"),
    [
        ("{{.Missing}}", {}, ["'Missing'", "{{.Missing}}", "line 1"]),
        ("x\n{{.A.B}}", {"A": "s"}, ["field B", "line 2"]),
        ("{{printf .A}}", {"A": 1}, ["'printf'", "{{printf .A}}"]),
        ("{{with .A}}x{{end}}", {"A": 1}, ["'with'"]),
        ("a{{end}}", {}, ["unexpected {{end}}"]),
        ("{{else}}", {}, ["unexpected {{else}}"]),
        ("{{if .A}}x", {"A": 1}, ["{{if}} not closed", "{{if .A}}"]),
        ("{{range .L}}x{{else}}", {"L": []}, ["{{range}} not closed"]),
        ("line1\n{{.A", {"A": 1}, ["unclosed action", "line 2"]),
        ("{{if .A}}a{{else}}b{{else}}c{{end}}", {"A": 1}, ["extra else", "line 1"]),
        ("{{if .A}}a{{end .A}}", {"A": 1}, ["after end"]),
        ("{{len}}", {}, ["wrong number of args for len"]),
        ("{{ne 1}}", {}, ["wrong number of args for ne"]),
        ("{{.A .B}}", {"A": 1, "B": 2}, ["non-function", "{{.A .B}}"]),
        ("{{}}", {}, ["missing value", "{{}}"]),
        ("{{.A | len}}", {"A": "x"}, ["unexpected '|'"]),
        ("{{eq .A 1}}", {"A": "1"}, ["incompatible types", "{{eq .A 1}}"]),
        ("{{eq .L .L}}", {"L": []}, ["uncomparable"]),
        ("{{index .L 5}}", {"L": [1]}, ["index out of range: 5"]),
        ("{{len .N}}", {"N": 3}, ["len of type int"]),
        ("{{range .S}}{{end}}", {"S": "abc"}, ["can't range over str"]),
        ("{{if $a, $b := .L}}{{end}}", {"L": [1]}, ["too many declarations"]),
        ("{{range $a, $b, $c := .L}}{{end}}", {"L": [1]}, ["bad variable declaration"]),
        ("{{/* open */ x}}", {}, ["text after comment"]),
        ("{{range $x := .L}}{{else}}{{$x}}{{end}}", {"L": []}, ["undefined variable '$x'"]),
        ("{{eq (len .L}}", {"L": []}, ["unclosed left paren"]),
        ("{{#}}", {}, ["unexpected '#'"]),
    ],
)
def test_errors(text: str, data: dict[str, Any], fragments: list[str]) -> None:
    with pytest.raises(TemplateError) as info:
        render(text, data)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_template_error_is_value_error() -> None:
    assert issubclass(TemplateError, ValueError)
