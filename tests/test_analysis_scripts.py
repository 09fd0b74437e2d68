"""Smoke runs of the tools (`python -m tools...`) and experiment summarizers on the records under docs/results, as
the run scripts and READMEs call them, or on tiny data a test makes; each checks what the run printed or wrote."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from sim.world import SimWorld

ROOT = Path(__file__).resolve().parents[1]
EMB, ADA = ROOT / "docs/results/embedded_cpu", ROOT / "docs/results/adaturn_cpu"


def script(module, *args):
    proc = subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_plot_runs(tmp_path):
    script("tools.analysis.plot_runs", "--run", f"alpha 0={EMB / 'ppo_metrics.jsonl.gz'}",
           "--run", f"alpha 0.6={EMB / 'alpha06_ppo_metrics.jsonl.gz'}", "--out", tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 10_000


def test_eval_table():
    out = script("tools.analysis.eval_table", EMB / "eval_summary.json", EMB / "alpha06_eval_summary.json")
    rows = [line for line in out.splitlines() if line.startswith("|")]
    assert len(rows) >= 4 and "---" in rows[1]


def test_adaturn_modes(tmp_path):
    script("tools.analysis.adaturn_modes", "--budgets", ADA / "budgets.json",
           "--metrics", f"forced={ADA / 'v2_grpo_metrics.jsonl.gz'}", "--out", tmp_path)
    assert {"modes.json", "modes.png", "modes_curves.png"} <= {p.name for p in tmp_path.iterdir()}


def test_diagnose_failures(tmp_path):
    """Two runs over the same questions: one asks each hop and copies the reply, one answers unasked."""
    qs = SimWorld(seed=0).questions(6, seed=1, split="test", two_hop_frac=0.5)
    recs = []
    for q in qs:
        turns = [{"action": "route", "ok": True, "model": "Mixtral-8x22B-Instruct", "query": h.sub_question,
                  "information": f"{h.answer}."} for h in q.hops]
        common = {"uid": q.uid, "question": q.question, "golds": q.answers, "data_source": "sim", "format_ok": True}
        recs.append({**common, "run": "guess", "em": 0.0, "turns": []})
        recs.append({**common, "run": "routed", "em": 1.0, "turns": turns})
    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = script("tools.analysis.diagnose_failures", path)
    assert "== guess: 6 questions, EM 0.000" in out and "no_route 6" in out
    assert "won 6" in out and "EM difference +1.000" in out


def test_diagnose_failures_reads_a_wrong_first_hop_apart_from_a_bad_query(tmp_path):
    """A second route that asks the right relation of the entity a wrong first reply named is hop 1's miss."""
    world = SimWorld(seed=0)
    two = [q for q in world.questions(40, seed=1, split="test", two_hop_frac=1.0) if len(q.hops) == 2]
    q, other = next((a, b) for a in two for b in two if a.hops[0].answer != b.hops[0].answer
                    and a.hops[0].answer in a.hops[1].sub_question
                    and (p := world.parse(a.hops[1].sub_question.replace(a.hops[0].answer, b.hops[0].answer)))
                    and p.entity.name == b.hops[0].answer)
    wrong = other.hops[0].answer
    follow = q.hops[1].sub_question.replace(q.hops[0].answer, wrong)
    common = {"uid": q.uid, "question": q.question, "golds": q.answers, "data_source": "sim", "format_ok": True,
              "em": 0.0}
    recs = [{**common, "run": run, "turns": [
        {"action": "route", "ok": True, "model": "Mistral-7B-Instruct", "query": q.hops[0].sub_question,
         "information": f"{wrong}."},
        {"action": "route", "ok": True, "model": "Mistral-7B-Instruct", "query": query, "information": "Nowhere."}]}
        for run, query in (("followed", follow), ("slipped", "Where was Nobody Atall born?"))]
    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = script("tools.analysis.diagnose_failures", path)
    followed, slipped = out.split("== slipped")
    assert "bad_query 0  wrong_hop1 1" in followed and "hop after wrong" in followed
    assert "bad_query 1  wrong_hop1 0" in slipped


POOL, GEMMA = ROOT / "docs/results/pool_batching_cpu/runs", ROOT / "docs/results/h200/pipeline_gemma_s4"


def _eval_summary(wall_s: float, failed: int) -> dict:
    overall = {"pool_errors": {"deadline": failed} if failed else {}, "pool_calls": 2, "pool_failed": failed,
               "pool_latency_p50_s": 1.5, "pool_latency_p95_s": 2.5, "f1": 0.25, "cost_1e6_usd": 1.0}
    return {"runs": [{"wall_s": wall_s, "overall": overall}]}


def test_pool_batching_table_on_the_record():
    """The README's table and reply check, from the summaries and trajectories kept in runs/."""
    lines = script("tools.analysis.pool_batching_table").splitlines()
    rows = {line.split()[0]: line.split() for line in lines[1:-1]}
    assert set(rows) == {p.name for p in POOL.iterdir()} and len(rows) == 6
    assert rows["before_patient"][1:4] == ["248.5", "60", "0"] and rows["after_patient"][1] == "129.4"
    assert rows["before_default"][3:6] == ["41", "deadline", "41"]
    assert lines[-1] == "before_patient vs after_patient: 60 of 60 pool replies identical"


def test_pool_batching_table_counts_a_changed_reply(tmp_path):
    for run, wall, failed, replies in (("before_patient", 9.0, 0, ["a", "b", "c"]),
                                       ("after_patient", 4.5, 1, ["a", "B", "c"])):
        (tmp_path / run).mkdir()
        (tmp_path / run / "summary.json").write_text(json.dumps(_eval_summary(wall, failed)))
        (tmp_path / run / "trajectories.jsonl").write_text(
            "".join(json.dumps({"uid": f"q{i}", "turns": [{"information": r}]}) + "\n" for i, r in enumerate(replies)))
    lines = script("tools.analysis.pool_batching_table", tmp_path).splitlines()
    assert lines[1].split() == ["after_patient", "4.5", "2", "1", "deadline", "1", "1.5", "2.5", "0.250", "1.000"]
    assert lines[-1] == "before_patient vs after_patient: 2 of 3 pool replies identical"


def test_summarize_gemma_h200_reproduces_its_summary(tmp_path):
    """Run on a copy of the record's inputs: the tables it prints are the recorded summary.txt, and it draws the plot."""
    for name in ("ppo_alpha0_metrics.jsonl.gz", "ppo_alpha0.6_metrics.jsonl.gz", "eval_hf_trajectories.jsonl.gz"):
        shutil.copy(GEMMA / name, tmp_path / name)
    out = script("experiments.gemma_h200.summarize", tmp_path).splitlines()
    recorded = (GEMMA / "summary.txt").read_text().splitlines()
    assert out[:-1] == recorded[:-1] and "the 127 questions clean in every run" in "\n".join(out)
    assert (tmp_path / "val_curves.png").stat().st_size > 10_000


def test_diag_attention_kernels_on_cpu():
    """The tiny model on the CPU: the device's fp32 path is the reference itself, bf16 is close but not equal,
    kernels the CPU lacks are reported as refused, and greedy decoding in fp32 matches token for token."""
    out = script("tools.check.diag_attention_kernels", "--device", "cpu", "--tiny")
    stats = {}
    for line in out.splitlines():
        m = re.match(r"(.+?)\s+max\|dlogit\|\s+(\S+)\s+mean KL (\S+)\s+argmax agree (\S+)", line)
        if m:
            stats[m.group(1)] = tuple(map(float, m.groups()[1:]))
    assert stats["cpu fp32 default"] == (0.0, 0.0, 1.0)
    dlogit, kl, agree = stats["cpu bf16-autocast MATH"]
    assert 0 < dlogit < 0.5 and 0 <= kl < 1e-3 and agree > 0.8
    assert "train-mode bf16 MATH" in stats and "refused: RuntimeError" in out
    assert re.search(r"generate cpu torch.float32\s+tokens equal to cpu: 8/8", out)


def test_summarize_async_lora_ray_reproduces_the_record(tmp_path):
    """On a copy of the H200 record: the same summary.json, and a run slowed down shows in its ratio."""
    rec = ROOT / "docs/results/h200/async_lora_ray"
    for phase in ("ppo", "ray", "streams"):
        shutil.copytree(rec / phase, tmp_path / phase)
    out = script("experiments.async_lora_ray.summarize", tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text()) == json.loads((rec / "summary.json").read_text())
    assert "speedup ray_vs_single_process: 1.08x" in out
    assert {"step_time_parts.png", "training_curves.png"} <= {p.name for p in tmp_path.iterdir()}
    import gzip
    path = tmp_path / "ray/ray_metrics.jsonl.gz"
    rows = [json.loads(line) for line in gzip.open(path, "rt")]
    for r in rows:
        if "timing/step" in r:
            r["timing/step"] *= 2  # Ray twice as slow per step
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    script("experiments.async_lora_ray.summarize", tmp_path)
    ratio = json.loads((tmp_path / "summary.json").read_text())["speedup_median_step"]["ray_vs_single_process"]
    assert abs(ratio - 1.08 / 2) < 0.01


def test_check_slot_rollout_on_a_tiny_model(tmp_path):
    """The GPU check of the continuous-batching path, on CPU: every turn decodes as the batch path."""
    from verl.utils.tiny import tiny_tokenizer

    spec = {"model_type": "llama", "vocab_size": len(tiny_tokenizer()), "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 512}
    (tmp_path / "m.json").write_text(json.dumps(spec))
    out = script("tools.check.check_slot_rollout", "--model", tmp_path / "m.json", "--tokenizer", "tiny", "--n", 4,
                 "--slots", 2, "--new-tokens", 8, "--device", "cpu")
    assert "8 of 8 turns decoded identically" in out


def test_bench_rollout_schedule_prints_one_speedup_per_mode():
    out = script("tools.bench.bench_rollout_schedule", "--batch", 4, "--repeats", 1, "--latency-scale", 0.05,
                 "--steps", 2, "--update-s", 0.05)
    speedups = re.findall(r"^speedup (\S+) vs sync: (\d+\.\d\d)x$", out, re.M)
    assert [m for m, _ in speedups] == ["overlap", "per-episode", "continuous", "streaming"]
    assert all(float(x) > 0 for _, x in speedups)
    assert re.search(r"^streaming +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+$", out, re.M)  # its step row


def test_bench_stream_convoy_reports_each_state():
    """The benchmark runs the real streaming rollout and reports each state; the slowdowns are measurements."""
    out = script("tools.bench.bench_stream_convoy", "--batch", 4, "--cycles", 1, "--window-s", 0.2,
                 "--latency-scale", 0.05)
    assert re.findall(r"^(alone|decoding|paused) +[\d,]+ ops/s", out, re.M) == ["alone", "decoding", "paused"]
    assert "paused vs decoding, paired per cycle: median" in out


def test_summarize_streaming_reads_runs_and_compares_with_sync(tmp_path):
    """Steps per hour, samples/s and tokens/s/GPU from the metrics; a run twice as fast per step is 2x sync."""
    for run, step_s in (("sync", 8.0), ("stream2x", 4.0)):
        rows = [{"step": k, "timing/step": step_s, "batch/episodes": 64.0, "timing/tokens_per_s": 1000.0 / step_s,
                 "reward/mean": 0.1 * k, "format_ok/mean": 0.5, "em/mean": 0.0} for k in range(1, 5)]
        (tmp_path / "a").mkdir(exist_ok=True)
        (tmp_path / "a" / f"{run}_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = script("experiments.streaming.summarize", tmp_path, "--gpus", 2)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps_per_hour_vs_sync"] == {"a/stream2x": 2.0, "a/sync": 1.0}
    fast = summary["runs"]["a/stream2x"]
    assert fast["steps_per_hour"] == 900.0 and fast["samples_per_s"] == 16.0 and fast["tokens_per_s_per_gpu"] == 125.0
    eq = summary["at_equal_samples"]
    assert eq["samples"] == 256 and eq["a/sync"]["format_ok"] == 0.5 and eq["a/sync"]["format_ok_se"] == 0.0
    assert (tmp_path / "learning_curves.png").exists() and (tmp_path / "throughput.png").exists()
    assert "a/stream2x" in out


def test_bench_gil_convoy_prints_one_line_per_switch_interval():
    """The benchmark runs and reports each interval; how much slower is a measurement, not checked here."""
    out = script("tools.bench.bench_gil_convoy", "--ops", 200, "--intervals", 0.001, 0.0005)
    lines = re.findall(r"^switch interval ([\d.]+) ms: 200 small ops alone [\d.]+ s, "
                       r"beside a Python thread [\d.]+ s \([\d.]+x slower\)$", out, re.M)
    assert lines == ["1.0", "0.5"]


def test_routing_vs_accuracy_reads_each_hops_domain_and_scores_the_routing(tmp_path):
    """One run sends every hop to its domain's best listed model, one sends all to Mixtral-8x22B: the shares, the
    share to the best model and the expected hop accuracy follow the pool's accuracy table."""
    from tools.analysis.routing_vs_accuracy import best_model, pool_table
    names, acc, price = pool_table(ROOT / "configs/pool/sim.yaml")
    assert "Palmyra-Creative-122B" not in names and len(names) == 6  # unseen models are not in the listing
    qs = SimWorld(seed=0).questions(40, seed=1, split="test", two_hop_frac=0.5)
    recs, domains = [], []
    for q in qs:
        common = {"uid": q.uid, "question": q.question, "golds": q.answers, "data_source": "sim", "format_ok": True,
                  "em": 1.0}
        best = [{"action": "route", "ok": True, "model": best_model(acc[h.domain], price, names),
                 "query": h.sub_question, "information": f"{h.answer}."} for h in q.hops]
        mixtral = [dict(t, model="Mixtral-8x22B-Instruct") for t in best]
        recs += [{**common, "run": "best", "turns": best}, {**common, "run": "mixtral", "turns": mixtral}]
        domains += [h.domain for h in q.hops]
    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    script("tools.analysis.routing_vs_accuracy", path, "--pool", ROOT / "configs/pool/sim.yaml",
           "--json", tmp_path / "r.json", "--plot", tmp_path / "r.png")
    runs = json.loads((tmp_path / "r.json").read_text())
    assert runs["best"]["hops"] == runs["mixtral"]["hops"] == len(domains)
    assert runs["best"]["share_to_best"] == 1.0 and runs["mixtral"]["share_to_best"] == 0.0
    assert abs(runs["best"]["expected_hop_accuracy"] - 0.95) < 1e-9
    assert abs(runs["mixtral"]["expected_hop_accuracy"] - 0.92) < 1e-9
    d = domains[0]
    assert runs["best"]["shares"][d][best_model(acc[d], price, names)] == 1.0
    assert runs["mixtral"]["shares"][d]["Mixtral-8x22B-Instruct"] == 1.0
    assert (tmp_path / "r.png").stat().st_size > 10_000
