"""The held-out split is fixed and never trained on; prompts state the problem and the hardware."""
from gemmgen.dsl import parse
from gemmgen.dsl.ir import Epilogue, Problem
from gemmgen.policy.training import data
from gemmgen.policy.prompt import HARDWARE_LINE, answer_statements, prompt_text


def test_heldout_is_a_fixed_fifth_of_the_grid_plus_the_offgrid_five():
    grid = data.grid_shapes()
    assert len(grid) == 1000
    held = [s for s in grid if data.is_heldout_shape(*s)]
    assert 150 <= len(held) <= 250
    assert held == [s for s in grid if data.is_heldout_shape(*s)]          # a pure function of the shape
    problems = data.heldout_problems()
    offgrid = [p for p in problems if p.n == 11008 and p.k == 4096 and p.b_major == "col"]
    assert sorted(p.m for p in offgrid) == [1, 7, 33, 1000, 3000]


def test_no_training_problem_is_held_out():
    problems = data.training_problems(offgrid=200)
    assert problems and not any(data.is_heldout(p) for p in problems)
    shapes = {(p.m, p.n, p.k) for p in problems}
    assert len(shapes) > 900
    assert {p.b_major for p in problems} == {"row", "col"}
    assert len({p.epilogue for p in problems}) > 3


def test_the_layer_sets_tuning_part_is_trained_on_and_its_held_out_families_never():
    rows, held = data.layer_rows()
    assert held == {"gemma2_9b", "phi3_medium", "granite3_8b"}
    widths = data.heldout_widths()
    assert (14336, 3584) in widths and (256000, 3584) in widths        # gemma2_9b's gate/up, LM head
    assert (4096, 4096) not in widths                                   # granite's q is also llama's
    problems = data.training_problems(offgrid=0)
    layers = {(p.m, p.n, p.k) for p in problems if p.b_major == "col"}
    assert (16, 4096, 4096) in layers or data.is_heldout_shape(16, 4096, 4096)
    assert not any((p.n, p.k) in widths for p in problems)
    assert data.is_heldout(Problem(3, 14336, 3584, b_major="col"))      # at any M


def test_unseen_random_shapes_are_fixed_and_never_trained_on_even_among_user_shapes():
    shapes = data.unseen_random_shapes()
    assert len(shapes) == data.UNSEEN_RANDOM == len(set(shapes))
    assert not set(shapes) & set(data.grid_shapes())
    m, n, k = shapes[0]
    for problem in (Problem(m, n, k), Problem(m, n, k, b_major="col", epilogue=Epilogue(bias="n"))):
        assert data.is_heldout(problem)                                 # any major, any epilogue
    base = data.training_problems(offgrid=50)
    more = data.training_problems(offgrid=50, user_shapes=300)
    assert set(base) <= set(more)                                       # the other draws stay as they were
    added = {(p.m, p.n, p.k) for p in set(more) - set(base)}
    assert len(added) == 300 and not added & set(shapes)
    assert min(n for _, n, _ in added) < 64 and max(m for m, _, _ in added) > 1024   # small and large sides
    unseen = data.unseen_problems()
    assert len(unseen) == len(data.heldout_layer_problems()) + 2 * data.UNSEEN_RANDOM
    assert all(data.is_heldout(p) for p in unseen)


def test_the_prompt_states_problem_and_hardware_and_parses_as_dsl():
    problem = Problem(1000, 11008, 4096, b_major="col", epilogue=Epilogue(bias="n", activation="silu"))
    text = prompt_text(problem)
    assert text.startswith(HARDWARE_LINE) and "sm_90a" in text and "132" in text
    assert "gemm 1000x11008x4096 a=row b=col" in text and "bias=n silu" in text
    assert "m=10 n=13 k=12" in text
    answer = "".join(f"{line}\n" for line in ("backend triton", "tile 128x128x64", "warps 2x2", "instr auto",
                                              "cluster 1x1", "stages 3", "mainloop multistage", "scheduler tile",
                                              "raster m swizzle=8", "smem_swizzle auto", "split_k 1"))
    assert [line.split()[0] for line in answer.splitlines()] == list(answer_statements())
    assert parse(text + answer).problem == problem


def _train_held_and_variants():
    """The first training and the first held-out grid problem, and four texts of one Triton
    program at the training problem (2-5 stages)."""
    from dataclasses import replace

    from gemmgen.dsl import to_text
    from tuning_fakes import triton_program

    train = next(Problem(m, n, k) for m, n, k in data.grid_shapes() if not data.is_heldout_shape(m, n, k))
    held = next(Problem(m, n, k) for m, n, k in data.grid_shapes() if data.is_heldout_shape(m, n, k))
    base = triton_program(train)
    return train, held, [to_text(replace(base, stages=s)) for s in (2, 3, 4, 5)]


def test_database_examples_are_the_fastest_checked_programs_winners_or_not(tmp_path):
    """The policy is judged against the fastest program the database holds, so that is what it
    learns from, even where cuBLAS was faster still; held-out problems never."""
    from gemmgen.dsl import to_text
    from gemmgen.tuning_db import Database
    from tuning_fakes import TEST_GPU, trial

    train, held, variants = _train_held_and_variants()
    with Database(tmp_path / "t.sqlite") as db:
        for text, ms, passed in zip(variants, (1.5, 1.3, 1.4, 1.0), (True, True, True, False)):
            db.record(trial(train, device_ms=ms, baseline_ms=1.2, program=text, check_passed=passed))
        db.record(trial(held, device_ms=0.5, baseline_ms=1.2))
        assert [w.problem for w in db.winners(TEST_GPU.name)] == [held]     # cuBLAS beat every `train` program
        programs = data.database_examples(db, TEST_GPU.name, top=2)
    assert [to_text(p) for p in programs] == [variants[1], variants[2]]   # 1.3 and 1.4 ms; 1.0 failed its check
    assert all(p.problem == train for p in programs)


def test_preference_pairs_prefer_the_faster_program_beyond_the_noise(tmp_path):
    """Pairs come from programs measured at the same training problem: the faster preferred,
    only where the speedups are `min_gain` apart; failed checks and held-out problems never."""
    from gemmgen.dsl import to_text
    from gemmgen.tuning_db import Database
    from tuning_fakes import TEST_GPU, trial

    train, held, texts = _train_held_and_variants()
    with Database(tmp_path / "t.sqlite") as db:
        # 1.00 and 1.02 ms are within the gain; 1.30 is apart from both; 0.5 ms failed its check
        for text, ms, passed in zip(texts, (1.00, 1.02, 1.30, 0.50), (True, True, True, False)):
            db.record(trial(train, device_ms=ms, baseline_ms=1.2, program=text, check_passed=passed))
        for text, ms in zip(texts, (1.0, 2.0)):
            db.record(trial(held, device_ms=ms, baseline_ms=1.2, program=text))
        pairs = data.preference_examples(db, TEST_GPU.name, min_gain=1.05)
        capped = data.preference_examples(db, TEST_GPU.name, min_gain=1.05, per_problem=1)
    assert sorted((to_text(a), to_text(b)) for a, b in pairs) == sorted([(texts[0], texts[2]), (texts[1], texts[2])])
    assert len(capped) == 1 and (to_text(capped[0][0]), to_text(capped[0][1])) in {(texts[0], texts[2]),
                                                                                      (texts[1], texts[2])}
    assert all(a.problem == b.problem == train for a, b in pairs)
    row = next(data.preference_rows(pairs[:1]))
    assert row["prompt"] == prompt_text(train)
    assert parse(row["prompt"] + row["chosen"]) == pairs[0][0]
    assert parse(row["prompt"] + row["rejected"]) == pairs[0][1]
