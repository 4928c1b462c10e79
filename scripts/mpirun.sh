#!/usr/bin/env bash
# mpirun with the flags a single machine needs: --oversubscribe (more ranks
# than cores) and --allow-run-as-root when run as root.
flags=(--oversubscribe)
[ "$(id -u)" -ne 0 ] || flags+=(--allow-run-as-root)
exec mpirun "${flags[@]}" "$@"
