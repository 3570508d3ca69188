"""The set of real language-model layers (benchmarks/shapes/llm_layers.csv) and its parser:
model/layer columns, the held-out families, and the split into tuning and held-out parts."""
import re
from collections import defaultdict
from pathlib import Path

import pytest

from gemmgen.measure.errors import ShapesError
from gemmgen.measure.shapes import Shape, held_out_models, parse_shapes, read_shapes, split_held_out

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ROOT / "benchmarks/shapes/llm_layers.csv"
MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
KINDS = {"q", "k", "v", "o", "qkv", "gate", "up", "gate_up", "down", "lm_head"}
FAMILY = re.compile(r"# family: (\w+) = .+ \((.+)\): hidden=(\d+) intermediate=(\d+) heads=(\d+) "
                    r"kv_heads=(\d+) head_dim=(\d+) vocab=(\d+)$")


@pytest.fixture(scope="module")
def shapes():
    return parse_shapes(LAYERS.read_text().splitlines(), str(LAYERS))   # every row, repeats too


@pytest.fixture(scope="module")
def families():
    """model -> (vendor, hidden, intermediate, heads, kv_heads, head_dim, vocab), from the header."""
    out = {}
    for line in LAYERS.read_text().splitlines():
        if match := FAMILY.match(line):
            out[match.group(1)] = (match.group(2), *map(int, match.groups()[2:]))
    return out


def _by_layer(shapes):
    """(model, layer) -> (N, K) and the M values seen, checking each layer has one (N, K)."""
    widths, ms = {}, defaultdict(list)
    for s in shapes:
        assert widths.setdefault((s.model, s.layer), (s.n, s.k)) == (s.n, s.k), (s.model, s.layer)
        ms[(s.model, s.layer)].append(s.m)
    return widths, ms


# ---- the shipped set ----------------------------------------------------------------------

def test_every_family_has_every_layer_at_every_m_as_nt(shapes):
    models = {s.model for s in shapes}
    assert len(models) >= 12
    assert all(s.layout == "nt" and s.model and s.layer in KINDS for s in shapes)
    widths, ms = _by_layer(shapes)
    assert {layer for (_, layer) in widths} == KINDS
    assert set(widths) == {(m, layer) for m in models for layer in KINDS}
    assert all(sorted(seen) == MS for seen in ms.values())      # each M exactly once per layer
    assert len(shapes) == len(models) * len(KINDS) * len(MS)
    p = shapes[0].problem()
    assert (p.a_major, p.b_major, p.c_major) == ("row", "col", "row")   # x @ W.T


def test_rows_follow_the_config_values_in_the_header(shapes, families):
    """Each family's header line gives its config; every row's N and K follow from it."""
    widths, _ = _by_layer(shapes)
    assert set(families) == {s.model for s in shapes}
    for model, (_, hidden, inter, heads, kv_heads, head_dim, vocab) in families.items():
        q, kv = heads * head_dim, kv_heads * head_dim
        want = {"q": (q, hidden), "k": (kv, hidden), "v": (kv, hidden), "o": (hidden, q),
                "qkv": (q + 2 * kv, hidden), "gate": (inter, hidden), "up": (inter, hidden),
                "gate_up": (2 * inter, hidden), "down": (hidden, inter), "lm_head": (vocab, hidden)}
        assert {layer: widths[(model, layer)] for layer in KINDS} == want, model
        assert heads % kv_heads == 0, model      # grouped-query attention: whole groups


def test_joined_layers_are_the_sum_of_their_parts(shapes):
    widths, _ = _by_layer(shapes)
    for model in {s.model for s in shapes}:
        w = {layer: widths[(model, layer)] for layer in KINDS}
        assert w["qkv"] == (w["q"][0] + w["k"][0] + w["v"][0], w["q"][1]), model
        assert w["gate_up"] == (w["gate"][0] + w["up"][0], w["gate"][1]), model
        assert w["k"] == w["v"] and w["gate"] == w["up"], model   # repeated rows are kept, not dropped


def test_a_fifth_of_the_families_is_held_out_and_named_in_the_header(shapes, families):
    held = held_out_models(LAYERS)
    models = {s.model for s in shapes}
    assert held < models and len(held) == round(len(models) / 5)
    header = [line for line in LAYERS.read_text().splitlines() if line.startswith("# held_out:")]
    assert len(header) == 1 and set(re.split(r"[,\s]+", header[0].split(":", 1)[1].strip())) == held
    assert len({families[m][0] for m in held}) > 1          # not all from one vendor


def test_tuning_and_held_out_parts_split_the_rows_by_model(shapes):
    held = held_out_models(LAYERS)
    tuning, held_rows = split_held_out(shapes, held)
    assert {s.model for s in held_rows} == held
    assert not {s.model for s in tuning} & held
    assert len(tuning) + len(held_rows) == len(shapes)
    assert sorted(map(id, tuning + held_rows)) == sorted(map(id, shapes))   # every row in exactly one part
    # Most held-out problems are unseen in the tuning part; otherwise the split measures nothing new.
    seen = {(s.n, s.k) for s in tuning}
    unseen = {(s.n, s.k) for s in held_rows} - seen
    assert len(unseen) > len({(s.n, s.k) for s in held_rows}) / 2


# ---- the parser ---------------------------------------------------------------------------

def test_labels_ride_along_without_changing_the_problem():
    rows = parse_shapes(["m,n,k,LAYOUT,Model,layer", "8,1024,4096,nt,llama3_8b,k", "8,1024,4096,nt,llama3_8b,v"])
    assert [(s.model, s.layer) for s in rows] == [("llama3_8b", "k"), ("llama3_8b", "v")]
    assert rows[0].key == rows[1].key == "8x1024x4096:nt"            # results keyed as before
    assert rows[0] == rows[1] == Shape(8, 1024, 4096, "nt") and len(set(rows)) == 1
    other = parse_shapes(["M,N,K,layer,model", "2,3,4,o,x"])[0]   # any order after M,N,K; layout defaults
    assert (other.layout, other.model, other.layer) == ("nn", "x", "o")


def test_existing_three_and_four_column_files_still_parse():
    sample = read_shapes(ROOT / "benchmarks/shapes/cudal2_sample100.csv")
    llama = read_shapes(ROOT / "benchmarks/shapes/llama_1b.csv")
    assert len(sample) >= 100 and all(s.layout == "nn" and s.model is None and s.layer is None for s in sample)
    assert llama and all(s.layout == "nt" and s.model is None for s in llama)
    assert held_out_models(ROOT / "benchmarks/shapes/llama_1b.csv") == frozenset()
    tuning, held = split_held_out(llama, held_out_models(ROOT / "benchmarks/shapes/llama_1b.csv"))
    assert tuning == llama and held == []


def test_held_out_from_lines_and_rows_without_a_model_tune():
    lines = ["# held_out: b", "M,N,K,layout,model,layer", "1,2,3,nt,a,q", "1,2,3,nt,b,q", "4,5,6,nt,,q"]
    assert held_out_models(lines) == frozenset({"b"})
    tuning, held = split_held_out(parse_shapes(lines), {"b"})
    assert [s.model for s in tuning] == ["a", None] and [s.model for s in held] == ["b"]


@pytest.mark.parametrize("lines,message", [
    (["M,N,K,layout,batch", "1,2,3,nt,4"], r"header column 'batch' is not known; allowed columns: M,N,K,layout,model,layer"),
    (["M,N,K,model,model", "1,2,3,a,b"], "names a column twice"),
    (["M,N,K,layout,model,layer", "1,2,3,nt,a"], r"expected 6 fields \(m,n,k,layout,model,layer\), got 5"),
    (["1,2,3,nt,a,q"], r"expected M,N,K\[,layout\], got 6"),     # model/layer need the header
    (["M,N,K,layout,model,layer", "1,2,3,nt,llama 3,q"], "model = 'llama 3'"),
])
def test_bad_columns_name_the_line_and_the_fix(lines, message):
    with pytest.raises(ShapesError, match=message) as info:
        parse_shapes(lines, "f.csv")
    assert re.search(r"f\.csv:\d", str(info.value))


def test_held_out_naming_an_absent_model_is_an_error(tmp_path):
    path = tmp_path / "set.csv"
    path.write_text("# held_out: a, zz_7b\nM,N,K,layout,model,layer\n1,2,3,nt,a,q\n1,2,3,nt,b,q\n")
    with pytest.raises(ShapesError, match=r"set\.csv:1: held_out names zz_7b, but no row has that model; "
                                          r"models present: a, b"):
        held_out_models(path)
    with pytest.raises(ShapesError, match="models present: none"):
        held_out_models(["# held_out: a", "M,N,K", "1,2,3"])
    with pytest.raises(ShapesError, match="a second held_out line"):
        held_out_models(["# held_out: a", "# held_out: b", "M,N,K,model", "1,2,3,a", "1,2,3,b"])
    with pytest.raises(ShapesError, match="held_out names c"):
        split_held_out(parse_shapes(["M,N,K,model", "1,2,3,a"]), {"c"})


def test_reading_a_part_keeps_the_held_out_families_apart_and_drops_repeats():
    """`gemmgen tune` reads the tuning part by default, `gemmgen bench --part held-out` the
    unseen families; a problem two layers share (k and v) is read once."""
    from gemmgen.cli.tune import tune_problems

    every = read_shapes(LAYERS)
    tuning, held = read_shapes(LAYERS, "tuning"), read_shapes(LAYERS, "held-out")
    assert len(every) == len({s.key for s in every}) < len(parse_shapes(LAYERS.read_text().splitlines()))
    assert {s.model for s in held} == held_out_models(LAYERS)
    assert not {s.model for s in tuning} & held_out_models(LAYERS)
    assert {p.key for p in tune_problems(str(LAYERS))} == {s.problem().key for s in tuning}
    assert {p.key for p in tune_problems(str(LAYERS), part="all")} == {s.problem().key for s in every}
    with pytest.raises(ShapesError, match="use one of all, tuning, held-out"):
        read_shapes(LAYERS, "train")


@pytest.mark.parametrize("path", sorted((ROOT / "benchmarks/shapes").glob("llm_layers_*.csv")), ids=lambda p: p.name)
def test_each_slice_of_the_set_holds_tuning_rows_only(path, shapes):
    """The slices tuning runs read (by M, by width) are rows of the set's tuning part, each once:
    no held-out family leaks into tuning through them."""
    held = held_out_models(LAYERS)
    tuning = {(s.m, s.n, s.k, s.layout, s.model, s.layer) for s in shapes if s.model not in held}
    rows = parse_shapes(path.read_text().splitlines(), str(path))
    assert rows
    keys = [(s.m, s.n, s.k, s.layout, s.model, s.layer) for s in rows]
    assert set(keys) <= tuning, sorted(set(keys) - tuning)[:3]
    assert len({(m, n, k, layout) for m, n, k, layout, _, _ in keys}) == len(keys)   # each problem once
