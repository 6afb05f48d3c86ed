"""Two of the peers' retrieval ideas measured on the gate's own arms (issue 43, "what the gate should learn").

- rerank: SeaKR keeps, among the retrieved passages, the one whose answers agree most. Inside the gate that
  would re-rank the evidence an arm returns. Its room: per item, whether the arm's first evidence holds a
  right answer (the grading rule over the evidence text), and when it does not, whether a later one does.
  Re-ranking can only gain on the second case.
- queries: DRAGIN and ETC search with words the model's attention chose. For every query a peer's eval rows
  kept, the arm's first evidence for that query against its first evidence for the question (what the gate
  searches with), on the same item: how often each holds a right answer, and the exact McNemar p.

    .venv/bin/python scripts/gate_ideas_retrieval.py --data results/peers/smollm2/factqa_halfB.jsonl \\
        --memory factkb.sqlite --rows results/peers/qwen/factqa_eval/results.jsonl --out F.json
    .venv/bin/python scripts/gate_ideas_retrieval.py --data results/peers/smollm2/halueval_halfB.jsonl \\
        --web http://127.0.0.1:8899 --rows results/peers/smollm2/halueval_eval/results.jsonl --out F.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer_table import mcnemar_p

from surprisegate.arms import Query
from surprisegate.research.grading import grade
from surprisegate.research.labeling import read_items

PEERS_WITH_QUERIES = ("dragin", "etc", "etc-trend", "flare")


def evidence_for(arm, text: str) -> list:
    return arm.ground(Query(span="", question=text, sentence=""), time.monotonic() + 30)


def holds_answer(evidence, item: dict) -> bool:
    return grade(evidence.evidence, item).correct


def rerank_room(question_evidence: dict[str, list], items: list[dict]) -> dict:
    counts = {
        "items": len(items),
        "no_evidence": 0,
        "several_candidates": 0,
        "first_right": 0,
        "first_wrong_later_right": 0,
        "none_right": 0,
    }
    for item in items:
        found = question_evidence[item["id"]]
        if not found:
            counts["no_evidence"] += 1
            continue
        counts["several_candidates"] += len(found) > 1
        right = [holds_answer(e, item) for e in found]
        key = "first_right" if right[0] else "first_wrong_later_right" if any(right) else "none_right"
        counts[key] += 1
    return counts


def query_comparison(arm, question_evidence: dict[str, list], items: list[dict], rows: list[dict]) -> dict:
    by_id = {it["id"]: it for it in items}
    out: dict = {}
    for mode in PEERS_WITH_QUERIES:
        pairs = []
        for row in rows:
            if row["mode"] != mode or row["id"] not in by_id:
                continue
            item = by_id[row["id"]]
            question_ev = question_evidence[item["id"]]
            question_right = bool(question_ev) and holds_answer(question_ev[0], item)
            for query in row.get("queries") or []:
                found = evidence_for(arm, query)
                pairs.append((question_right, bool(found) and holds_answer(found[0], item), bool(found)))
        if not pairs:
            continue
        only_question = sum(q and not p for q, p, _ in pairs)
        only_peer = sum(p and not q for q, p, _ in pairs)
        out[mode] = {
            "queries": len(pairs),
            "question_right": sum(q for q, _, _ in pairs),
            "peer_query_right": sum(p for _, p, _ in pairs),
            "peer_query_no_evidence": sum(not f for _, _, f in pairs),
            "only_question_right": only_question,
            "only_peer_query_right": only_peer,
            "exact_p": round(mcnemar_p(only_question, only_peer), 4),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--memory", default=None, help="a memory store (the memory arm)")
    ap.add_argument("--web", default=None, help="a SearxNG-compatible URL (the web arm)")
    ap.add_argument("--rows", type=Path, action="append", default=[], help="eval results.jsonl with peers' queries")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if bool(args.memory) == bool(args.web):
        ap.error("give one arm: --memory STORE or --web URL")
    if args.memory:
        from surprisegate.arms.memory import MemoryArm
        from surprisegate.store.open import open_memory

        arm, arm_name = MemoryArm(open_memory(args.memory)), f"memory:{args.memory}"
    else:
        from surprisegate.arms.web import build_web_arm

        arm, arm_name = build_web_arm(args.web), f"web:{args.web}"
    items = read_items(args.data)
    rows = [json.loads(line) for path in args.rows for line in path.read_text().splitlines() if line.strip()]
    question_evidence = {item["id"]: evidence_for(arm, item["question"]) for item in items}  # what the gate asks
    report = {
        "data": args.data,
        "arm": arm_name,
        "rows": [str(p) for p in args.rows],
        "rerank_room": rerank_room(question_evidence, items),
        "queries": query_comparison(arm, question_evidence, items, rows),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
