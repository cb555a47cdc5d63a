# Which strategy calibration would pick at looser thresholds, from a --sweep CSV:
#   python3 thresholds.py SWEEP.csv
# For each (max first-token KL, min agreement) pair, the least work that meets both.
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for kl, ag in [(0.05, 80), (0.1, 60), (0.15, 50), (0.2, 50), (0.3, 40)]:
    ok = [r for r in rows if float(r["first_token_kl"]) <= kl and float(r["agreement_pct"]) >= ag]
    if not ok:
        print(f"KL <= {kl}, agreement >= {ag}%: none (unsafe)")
        continue
    r = min(ok, key=lambda r: float(r["work_pct"]))
    print(f"KL <= {kl}, agreement >= {ag}%: {r['label']} at {float(r['work_pct']):.1f}% work "
          f"(KL {float(r['first_token_kl']):.3f}, agreement {float(r['agreement_pct']):.1f}%)")
