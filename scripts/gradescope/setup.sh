#!/usr/bin/env bash
# Gradescope builds the autograder image with this. run_autograder needs only python3, which
# Gradescope's base images have; nothing to install.
set -euo pipefail
command -v python3 >/dev/null || { apt-get update && apt-get install -y python3; }
