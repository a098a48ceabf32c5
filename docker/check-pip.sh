#!/usr/bin/env bash
# `pip check` in an image, held to what docker/pip-check.txt lists for that image: the
# requirements it leaves unmet on purpose (packages installed with --no-deps). The build's last
# layer runs it, so a new conflict, or a listed one that went away, fails the build.
#
#   ./check-pip.sh IMAGE LIST      IMAGE: training or serve; LIST: pip-check.txt
set -euo pipefail
image=$1
list=$2

expected=$(sed -n "s/^$image: //p" "$list" | sort)
found=$( (pip check 2>&1 || true) | grep -v '^No broken requirements found' | sort || true)
if [ "$found" = "$expected" ]; then
    count=$(grep -c . <<<"$found" || true)
    echo "pip check: only the $count unmet requirement(s) that pip-check.txt lists for $image" \
        "(packages installed without their dependencies on purpose)"
    exit 0
fi
echo "error: pip check differs from what pip-check.txt lists for $image" >&2
diff <(echo "$expected") <(echo "$found") | sed -n 's/^< /  listed, no longer reported: /p; s/^> /  reported, not listed: /p' >&2
exit 1
