#!/bin/bash
# Resumability check of `gi sweep` (issue 6): start configs/sweep/demo-cpu.yaml (12 jobs, 2 worker processes),
# kill -9 the whole process group once >= 6 jobs are finished, re-run the same command, and check that the
# finished jobs were skipped (their metrics.json untouched) and all 12 aggregate.
#   bash scripts/sweep_kill_restart.sh            (from the repository root; ~3 min on 2 cores)
set -u
cd "$(dirname "$0")/.."
OUT=runs/sweep-demo-cpu-killtest
LOGS=$OUT.logs
mkdir -p $LOGS
rm -rf $OUT
export GI_THREADS=1
date -u +"start %T"
setsid .venv/bin/gi sweep configs/sweep/demo-cpu.yaml out=$OUT > $LOGS/sweep1.log 2>&1 &
PID=$!
while true; do
  n=$(ls $OUT/jobs/*/metrics.json 2>/dev/null | wc -l)
  if [ "$n" -ge 6 ]; then break; fi
  sleep 2
done
kill -9 -- -$PID
sleep 2
date -u +"killed %T"
echo "finished before kill: $(ls $OUT/jobs/*/metrics.json | wc -l)"; ls -a $OUT/jobs | head -30
stat -c '%n %Y' $OUT/jobs/*/metrics.json > $LOGS/sweep_mtimes_before.txt
.venv/bin/gi sweep configs/sweep/demo-cpu.yaml out=$OUT > $LOGS/sweep2.log 2>&1
echo "rerun rc $?"
date -u +"done %T"
stat -c '%n %Y' $OUT/jobs/*/metrics.json > $LOGS/sweep_mtimes_after.txt
echo "finished after rerun: $(ls $OUT/jobs/*/metrics.json | wc -l)"
grep "already finished" $LOGS/sweep2.log
join <(sort $LOGS/sweep_mtimes_before.txt) <(sort $LOGS/sweep_mtimes_after.txt) | awk '{print ($2==$3)?"unchanged":"REDONE", $1}'
ls $OUT
