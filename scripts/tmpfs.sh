# Sourced by scripts/test and scripts/check: unless TMPDIR is set, the tests' files (stores,
# indexes, PostgreSQL's data) go to /dev/shm when it is a tmpfs with 2 GiB free (a full run
# peaks at 0.8 GiB). Every commit waits for its fsync, 3.5 ms on this machine's disk, and
# workers waiting on the disk left the cores idle. A container's default 64 MB /dev/shm would
# fill: there the disk is used.
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ] \
        && [ "$(df -Pk /dev/shm | awk 'NR == 2 {print $4}')" -ge 2097152 ]; then
    export TMPDIR=/dev/shm
fi
