"""Trace what ``width: "auto"`` chooses, call by call, against fixed widths on the same prompts.

For each prompt, runs plain AR, the automatic decoder and the fixed widths given (interleaved, so load hits
them alike), and for the automatic decoder records per call: the candidate label, the rows, the cached
context, the forward seconds the decoder observed (what the policy is fed through ``observe_call``), the
forward seconds the cost model predicted for those rows (raw, and corrected by the load and the label's
bias) and the tokens added. Prints where the automatic decoder's time goes against plain AR: calls and
seconds per label, the cost of probes and of switching, and predicted-vs-observed seconds by label.

Usage (machine noise matters: compare only the ratios of one run)::

    python scripts/auto_trace.py --task humaneval --limit 40 --widths 2,4 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from specframe import compose
from specframe.acceptance.base import Verdict
from specframe.bench.tasks import get_task
from specframe.ledger import outcome_pairs
from specframe.models import load_model
from specframe.models.chat import chat_prompt


def traced(decoder):
    """Wrap the decoder's auto schedule so that each call's choice, prediction and outcome are recorded."""
    schedule = decoder.schedule
    log: list[dict] = []
    plan, update, observe = schedule.plan, schedule.update, schedule.observe_call

    def traced_plan(state):
        out = plan(state)
        label = schedule.label()
        rate = schedule.rates.get(label)
        log.append({"label": label, "first": state.first_call, "rate": rate, "verify": len(out.chain_positions)})
        return out

    def traced_observe(state, rows, seconds, batch_rows=None):
        policy, entry = schedule.policy, log[-1]
        context = state.start + len(state.tokens)
        predicted = policy.cost.model_seconds(rows, context) if policy.cost is not None else None
        times = policy.times
        corrected = times.correct(entry["label"], predicted) if predicted and times is not None else predicted
        entry.update(rows=rows, context=context, observed_s=seconds, raw_predicted_s=predicted, predicted_s=corrected)
        return observe(state, rows, seconds, batch_rows)

    def traced_update(state, plan_, result):
        outcome = update(state, plan_, result)  # the ledger accepts it after this returns
        log[-1]["added"] = len(outcome_pairs(plan_, outcome))  # before the stopping rules
        log[-1]["accepted"] = outcome.accepted if isinstance(outcome, Verdict) else 0
        return outcome

    schedule.plan, schedule.update, schedule.observe_call = traced_plan, traced_update, traced_observe
    return log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="smoke")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--widths", default="2,4")
    parser.add_argument("--schedule", default="packed")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--json", default=None, help="write the per-call trace here")
    parser.add_argument("--model", default="nemotron-stdlib-tiny", help="a bundled model, a folder or a pulled name")
    parser.add_argument("--dtype", default=None, help="the model's dtype (default: its own)")
    args = parser.parse_args()

    model = load_model(args.model, dtype=args.dtype)
    task = get_task(args.task)
    examples = task.load(None)
    if args.limit:
        examples = examples[: args.limit]
    if task.prompt_template == "chat":  # as bench gives them: through the model's chat template
        prompts = [chat_prompt(model.tokenizer, ex.prompt, where="the chat task") for ex in examples]
    else:
        prompts = [ex.prompt for ex in examples]
    base = {"model": model, "max_new_tokens": args.max_new_tokens}
    methods = {"ar": compose({**base, "schedule": "ar"})}
    methods["auto"] = compose({**base, "schedule": args.schedule, "width": "auto"})
    for w in args.widths.split(","):
        methods[f"{args.schedule}/w{w}"] = compose({**base, "schedule": args.schedule, "width": int(w)})
    log = traced(methods["auto"])
    totals = defaultdict(lambda: [0.0, 0, 0])  # seconds, tokens, calls
    model_s = defaultdict(float)
    for decoder in methods.values():  # warm-up
        decoder.generate(prompts[0])
    per_request = []
    for i, prompt in enumerate(prompts):
        names = list(methods)
        names = names[i % len(names) :] + names[: i % len(names)]
        for name in names:
            start = len(log)
            result = methods[name].generate(prompt)
            m = result.metrics
            totals[name][0] += m.wall_s
            totals[name][1] += m.generated_tokens
            totals[name][2] += m.nfe
            model_s[name] += m.model_s
            if name == "auto":
                per_request.append(log[start:])
    ar_rate = totals["ar"][1] / totals["ar"][0]
    print(f"{'method':14s} {'tok/s':>8s} {'x ar':>6s} {'tok/NFE':>8s} {'ms/NFE':>7s} {'model':>6s} {'host':>6s}")
    for name, (s, tok, nfe) in totals.items():
        ms = 1e3 * model_s[name] / nfe
        print(
            f"{name:14s} {tok / s:8.1f} {tok / s / ar_rate:6.3f} {tok / nfe:8.3f} {1e3 * s / nfe:7.3f}"
            f" {ms:6.3f} {1e3 * s / nfe - ms:6.3f}"
        )

    steady = [e for req in per_request for e in req if not e["first"] and "observed_s" in e]
    by_label = defaultdict(list)
    for e in steady:
        by_label[e["label"]].append(e)
    print("\nauto, per label (calls after the prompt call; forward ms observed and predicted):")
    print(
        f"{'label':12s} {'calls':>6s} {'share s':>8s} {'obs ms':>7s} {'pred ms':>8s} {'raw':>6s}"
        f" {'tok/call':>8s} {'pred':>5s} {'rows':>5s}"
    )
    spent = sum(e["observed_s"] for e in steady)
    for label, entries in sorted(by_label.items(), key=lambda kv: -len(kv[1])):
        obs = sum(e["observed_s"] for e in entries) / len(entries)
        preds = [e["predicted_s"] for e in entries if e["predicted_s"]]
        pred = sum(preds) / len(preds) if preds else float("nan")
        tok = sum(e["added"] for e in entries) / len(entries)
        rows = sum(e["rows"] for e in entries) / len(entries)
        raws = [e["raw_predicted_s"] for e in entries if e["raw_predicted_s"]]
        mod = sum(raws) / len(raws) if raws else float("nan")
        ptok = [e["rate"] * e["predicted_s"] for e in entries if e["rate"] and e["predicted_s"]]
        ptok = sum(ptok) / len(ptok) if ptok else float("nan")
        share = sum(e["observed_s"] for e in entries) / spent
        print(
            f"{label:12s} {len(entries):6d} {share:8.3f} {1e3 * obs:7.3f} {1e3 * pred:8.3f} {1e3 * mod:6.3f}"
            f" {tok:8.3f} {ptok:5.2f} {rows:5.1f}"
        )
    switches = sum(1 for req in per_request for a, b in zip(req, req[1:], strict=False) if a["label"] != b["label"])
    pairs = [(a["label"], b["label"]) for req in per_request for a, b in zip(req, req[1:], strict=False)]
    drafting_after_ar = [b for a, b in pairs if a == "ar" and b != "ar"]
    print(f"\nswitches: {switches} over {len(steady)} calls; AR->drafting calls: {len(drafting_after_ar)}")
    first_labels = defaultdict(int)
    for req in per_request:
        seq = [e["label"] for e in req[1:6]]
        first_labels[" ".join(seq)] += 1
    print("first 5 choices per request (most common):")
    for seq, n in sorted(first_labels.items(), key=lambda kv: -kv[1])[:6]:
        print(f"  {n:3d}x {seq}")
    print("\nlabel sequence of the first 3 requests:")
    for req in per_request[:3]:
        print(" ", " ".join(e["label"].replace("packed/", "") for e in req))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(per_request, fh)


if __name__ == "__main__":
    main()
