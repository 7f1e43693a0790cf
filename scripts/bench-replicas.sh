#!/usr/bin/env bash
# A 40 s film (1,200 frames, 5 s segments) restored as a service job on one replica and on two
# sharing a PostgreSQL cluster of their own (tests/suite/replicas.rs starts it from Debian's package)
# and a jobs folder, alternated ROUNDS times (3): each run's wall time from the post to done,
# which replica restored which segments, the medians and their ratio. On one machine both
# replicas share its cores: the figure that matters there is that both worked and nothing was
# redone; on two GPUs the ratio is the speed-up.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source .deps/env.sh
GPEN_VIDEO_ROUNDS=${ROUNDS:-3} cargo test --release --locked --test suite -- --ignored --nocapture \
  replicas::wall_time_of_a_film_on_one_replica_and_on_two 2>&1 | grep -E "round|median|panicked|test result"
