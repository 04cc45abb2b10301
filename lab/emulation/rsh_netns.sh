#!/bin/sh
# Open MPI's plm_rsh_agent for the emulated cluster (lab/emulation/netns.py): what ssh would do, with
# `ip netns exec` as the transport. mpirun calls `rsh_netns.sh HOST COMMAND...`; like ssh, the
# words of COMMAND are joined and run by a shell on the "remote" host. The host's own UTS
# namespace gives it its own hostname, which is how Open MPI and Horovod tell hosts apart.
set -eu
host=${1:?usage: rsh_netns.sh HOST COMMAND...}
shift
prefix=${ALLREDUCE_TRAIN_NETNS:?rsh_netns.sh: ALLREDUCE_TRAIN_NETNS is not set; start the job with python -m lab.emulation --emulate-hosts N}
case $host in
    h[0-9]*) case $host in h*[!0-9]*) host_ok=no ;; *) host_ok=yes ;; esac ;;
    *) host_ok=no ;;
esac
if [ "$host_ok" = no ]; then
    echo "rsh_netns.sh: $host is not an emulated host (h1, h2, ...)" >&2
    exit 255
fi
ns="$prefix-$host"
if [ ! -e "/run/netns/$ns" ]; then
    echo "rsh_netns.sh: no emulated host $host (namespace $ns does not exist)" >&2
    exit 255
fi
# As ssh cannot reach a host whose cable is pulled, neither can this agent: the host's link must be up
# at both ends (UP: the host's end; LOWER_UP: carrier, i.e. the switch's end is up too). The launcher's
# elastic probe (launch/elastic.py) and mpirun both come through here.
flags=$(ip -n "$ns" -o link show dev emu0 2>/dev/null | sed -n 's/^[^<]*<\([^>]*\)>.*/,\1,/p')
case $flags in
    *,UP,*) case $flags in *,LOWER_UP,*) ;; *) flags= ;; esac ;;
    *) flags= ;;
esac
if [ -z "$flags" ]; then
    echo "rsh_netns.sh: connect to host $host: its link is down (namespace $ns)" >&2
    exit 255
fi
exec ip netns exec "$ns" unshare --uts -- sh -c 'hostname "$0" && exec sh -c "$*"' "$host" "$@"
