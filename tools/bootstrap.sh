#!/bin/sh
# Installs the Debian packages lutra needs when they are missing, then runs a make target:
#   sh tools/bootstrap.sh run     # builds and trains the example MLP
#   sh tools/bootstrap.sh test    # builds and runs the specs
#   sh tools/bootstrap.sh test-asan  # the CPU specs under ASan + UBSan (libasan comes with gcc)
#   sh tools/bootstrap.sh lab     # the recipe lab, with gnuplot for its plot
# Nothing is downloaded but Debian packages.
set -eu
cd "$(dirname "$0")/.."

packages="gcc make pkg-config luajit libluajit-5.1-dev lua-busted libopenblas-dev"
# the recipe lab plots with gnuplot: sh tools/bootstrap.sh lab
case " $* " in *" lab "*) packages="$packages gnuplot-nox" ;; esac
missing=""
for p in $packages; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing="$missing $p"
  fi
done

if [ -n "$missing" ]; then
  echo "bootstrap: installing$missing"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y --no-install-recommends $missing ||
    { $sudo apt-get update && $sudo apt-get install -y --no-install-recommends $missing; }
fi

exec make "$@"
