#!/usr/bin/env bash
# Everything CI checks: lint, types, front-end tests, then pytest (real browser and JupyterLab
# tests included). Run after scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"
# The browser tests (tests/e2e) are part of this command: a missing Chromium, playwright or built
# bundle fails them instead of skipping them (tests/e2e/conftest.py reads this).
export META_WIDGET_REQUIRE_BROWSER=1

# Chromium for the real-browser tests (Debian's package; browser downloads do not work here).
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "test: /usr/bin/chromium is missing and we are not root: install it" \
      "(sudo apt-get install -y chromium); the browser tests will fail without it" >&2
  fi
fi

ruff format --check meta_widget tests benchmarks examples
ruff check meta_widget tests benchmarks examples
mypy
npm run check
# The documentation site, every warning an error (a broken link, an API entry that does not resolve).
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --site-dir "$PWD/test-artifacts/site"
# Two processes by default (pytest-xdist, work-stealing): most tests trace on one core, and a
# notebook's kernel or a browser waits while the other process runs; PYTEST_WORKERS=0 is one process.
python -m pytest tests -n "${PYTEST_WORKERS:-2}" --dist worksteal --durations=60 "$@"
