#!/usr/bin/env bash
# Installs what is missing (Debian and Python packages) and builds poptorch
# into the source tree (an editable install). Safe to run again: it only
# installs what is absent and rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
# chromium: the tests open the profile's HTML page in a real (headless) browser.
for pkg in g++ cmake ninja-build ccache libgtest-dev libabsl-dev libgoogle-glog-dev chromium; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "Installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

python -m pip install -q --disable-pip-version-check --root-user-action=ignore -r requirements.txt
# No build isolation: an isolated build environment would download another torch.
python -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-build-isolation --no-deps -e .
