"""Rerun the survivors of a mutation.json against the tests now in the tree (no baseline run):
each surviving mutant (not in EQUIVALENT) is applied, exactly as make_mutants makes it, in a copy
of the tree, and the given test files run with pytest -x. Outcomes are written back; a mutant
killed here keeps "survived" as its before-outcome (the first run's tests let it live).

    python benchmarks/recheck_survivors.py OLD.json TREE_COPY NEW.json tests/core/test_a.py …

Faster than ``mutation.py --only-survivors`` (no baseline run of every stage): for survivors of a
full run that only new tests should kill. TREE_COPY is a copy of the checkout (never the checkout)."""
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mutation as M

src_json, tree, out_json = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
tests = sys.argv[4:]
d = json.loads(src_json.read_text())
by_module = {}
for m in d["mutants"]:
    if m["outcome"] in ("killed", "timeout") or m["key"] in M.EQUIVALENT:
        continue
    by_module.setdefault(m["module"], []).append(m)
for module, survivors in by_module.items():
    path = tree / M.module_path(module)
    original = path.read_text()
    made = {mm.key: source for mm, source in M.make_mutants(module, original)}  # make_mutants numbers them
    for m in survivors:
        if m["key"] not in made:
            print("not made again:", m["key"]); continue
        try:
            path.write_text(made[m["key"]])
            env = M.test_env(tree)
            t0 = time.monotonic()
            r = subprocess.run(["nice", "-n", "10", sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                                "-o", "addopts=", *tests], cwd=tree, env=env, capture_output=True, text=True, timeout=900)
        finally:
            path.write_text(original)
        failed = [l.split(" ")[1] for l in r.stdout.splitlines() if l.startswith(("FAILED ", "ERROR "))]
        print(m["line"], m["operator"], m["before"][:50], "→", r.returncode, failed[:1], flush=True)
        if r.returncode in (1, 2):
            m["before_outcome"] = m.get("before_outcome") or "survived"  # the tests of the first run let it live
            m["outcome"], m["killer"], m["seconds"] = "killed", failed[0] if failed else f"exit {r.returncode}", time.monotonic() - t0
            m["stage"] = 0
out_json.write_text(json.dumps(d, indent=1, ensure_ascii=False))
