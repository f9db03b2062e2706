"""Regression gating: is the head slower than its baseline, and where did a step come from?

    policy.py      which metrics are gated, direction, smallest change that matters
    stats.py       one metric of one cell: Mann-Whitney + Hodges-Lehmann + its exact (Moses)
                   interval -> verdict
    baselines.py   where baselines come from (A/B, MLflow, JSON file) and how a run becomes one
    judge.py       every cell and metric of a gate -> one exit code
    abtest.py      base and head measured on one host, interleaved, from git worktrees
    run.py         `harness gate`: measure or load the head, find the baseline, judge
    report.py      markdown (PR comment), JUnit XML, JSON, terminal table
    github.py      post or update the one PR comment
    changepoint.py binary segmentation with a permutation test
    history.py     `harness history`: per-cell series from MLflow and their steps
    bisect.py      `harness bisect`: git bisect run on one cell
    evaluate.py    the simulation benchmark behind results/gate-evaluation.md
    evaluate_changepoint.py  changepoint.py next to ruptures and Otava on simulated series
                   (results/changepoint-evaluation.md)
"""
