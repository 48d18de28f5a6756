#!/usr/bin/env bash
# Installs sdc-guard on one node of a SageMaker HyperPod Slurm cluster. Call it
# from your lifecycle script (on_create.sh / lifecycle_script.py) on every
# node, as root, after Slurm is configured:
#
#   bash install_sdc_guard.sh --torch-lib /fsx/venv/lib/python3.11/site-packages/torch/lib /fsx/sdc-guard/dist
#   SDC_GUARD_DIST=/fsx/sdc-guard/dist bash install_sdc_guard.sh
#   bash install_sdc_guard.sh --role compute --coordinator 10.1.0.10:7400 --torch-lib DIR /fsx/sdc-guard/dist
#   bash install_sdc_guard.sh --pki /fsx/sdc-guard/pki --torch-lib DIR /fsx/sdc-guard/dist
#
# DIST is the release bundle from `./sdc release`: its tarball
# sdc-guard-VERSION-linux-x86_64.tar.gz, the unpacked directory, or a
# directory (such as dist/) holding one of them. It is installed whole under
# /opt/sdc-guard/VERSION, /opt/sdc-guard/current points at it, and the
# role's programs are linked into /usr/local/bin (what the units run). An
# upgrade installs the new version beside the old one and moves `current`;
# the old directory stays for a rollback (`ln -sfn OLD /opt/sdc-guard/current`).
# The units and trainer-env.sh are taken from DIST when present there, else
# from this script's deploy/slurm directory (../ of this file).
#
# Role: --role controller|compute|login, else from HyperPod's resource config
# ($SAGEMAKER_RESOURCE_CONFIG_PATH, default /opt/ml/config/resource_config.json):
# the instance group holding this node's IP address is compared with
# controller_group / login_group of provisioning_parameters.json (looked up in
# $SDC_PROVISIONING_PARAMETERS, ./, this directory and its parent, and
# /opt/ml/config/). Without that file a group named like *controller* or
# *head* is the controller and one named like *login* the login group.
#
#   controller: user sdc, sdcd + sdcctl, sdcd.service enabled and started
#   compute:    user sdc, sdc-agent (+ sdcctl), /etc/default/sdc-agent,
#               sdc-agent.service enabled and started
#   login:      sdcctl only
# Every role gets /usr/local/share/sdc-guard/trainer-env.sh.
#
# The coordinator address for compute nodes: --coordinator, else
# $SDC_COORDINATOR, else the controller group's first IP address in the
# resource config, port 7400 (trainers); agents dial the same host on 7402
# (sdcd's --agent_listen).
#
# Node identities (docs/operations.md, "Trust model"): sdcd takes a node's
# evidence only from a caller proven to be that node, here by a certificate
# from the cluster's CA whose DNS name is the node's Slurm name. With --pki
# DIR (a directory on the cluster's shared file system, readable by root
# only: whoever reads ca.key can speak for every node) the controller makes
# the CA there once, and each node its own certificate under
# /etc/sdc-guard/tls (ca.crt; sdcd.crt/.key on the controller, node.crt/.key
# on compute nodes). Without --pki, put those files there yourself before
# the units start. A node's key is readable by root and the trainers' group
# (--trainer-group, default sdc): a trainer that dials sdcd presents it, and
# only that group's users can.
#
# Options:
#   --role ROLE          controller, compute or login (skips detection)
#   --dist PATH          the release bundle (or the first non-option argument,
#                        or $SDC_GUARD_DIST)
#   --torch-lib DIR      compute nodes: torch 2.11.0's lib/ directory (holds
#                        libtorch.so; the training environment's
#                        site-packages/torch/lib), which sdc-agent links and
#                        the bundle does not carry (or $SDC_TORCH_LIB)
#   --coordinator H:P    sdcd's trainer address (agents dial H:7402)
#   --pki DIR            the cluster's CA on shared storage (see above)
#   --trainer-group G    the group whose users' trainers may read this node's
#                        key and use the relay socket (default sdc)
#   --relay-uids U,...   compute nodes: the agent relays the node's trainer
#                        streams to sdcd (sdc-agent --relay_listen on
#                        unix:/run/sdc-agent/relay.sock; trainer-env.sh points
#                        trainers at it) for processes of these uids only
#                        (SO_PEERCRED). For large clusters:
#                        docs/ARCHITECTURE.md, "Relay"
#   --sdcd-user USER     run sdcd as USER (e.g. slurm, when the sdc user cannot
#                        be made a Slurm operator): writes a unit drop-in
#   --self-ip IP         this node's address (default: hostname -I)
#   --root DIR           install under DIR instead of /; creates no user and
#                        runs no systemctl (for packaging and tests)
#   --no-start           enable nothing, start nothing
#
# Slurm rights: the slurm actuator runs `scontrol update node=... state=fail`,
# which needs a Slurm operator: `sacctmgr -i add user sdc account=root
# adminlevel=operator` once accounting runs, or --sdcd-user slurm.
set -euo pipefail

log() { echo "install_sdc_guard: $*"; }
die() {
  echo "install_sdc_guard: error: $*" >&2
  exit 1
}

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
role=""
dist="${SDC_GUARD_DIST:-}"
coordinator="${SDC_COORDINATOR:-}"
sdcd_user=""
self_ip=""
root="/"
start=1
relay=
relay_uids=
pki=""
trainer_group=sdc
torch_lib="${SDC_TORCH_LIB:-}"
resource_config="${SAGEMAKER_RESOURCE_CONFIG_PATH:-/opt/ml/config/resource_config.json}"

while (($# > 0)); do
  case "$1" in
    --role) role="${2:?--role needs a value}"; shift 2 ;;
    --role=*) role="${1#*=}"; shift ;;
    --dist) dist="${2:?--dist needs a value}"; shift 2 ;;
    --dist=*) dist="${1#*=}"; shift ;;
    --coordinator) coordinator="${2:?--coordinator needs a value}"; shift 2 ;;
    --coordinator=*) coordinator="${1#*=}"; shift ;;
    --sdcd-user) sdcd_user="${2:?--sdcd-user needs a value}"; shift 2 ;;
    --sdcd-user=*) sdcd_user="${1#*=}"; shift ;;
    --self-ip) self_ip="${2:?--self-ip needs a value}"; shift 2 ;;
    --self-ip=*) self_ip="${1#*=}"; shift ;;
    --root) root="${2:?--root needs a value}"; shift 2 ;;
    --root=*) root="${1#*=}"; shift ;;
    --torch-lib) torch_lib="${2:?--torch-lib needs a value}"; shift 2 ;;
    --torch-lib=*) torch_lib="${1#*=}"; shift ;;
    --no-start) start=0; shift ;;
    --relay-uids) relay_uids="${2:?--relay-uids needs a value}"; shift 2 ;;
    --relay-uids=*) relay_uids="${1#*=}"; shift ;;
    --pki) pki="${2:?--pki needs a value}"; shift 2 ;;
    --pki=*) pki="${1#*=}"; shift ;;
    --trainer-group) trainer_group="${2:?--trainer-group needs a value}"; shift 2 ;;
    --trainer-group=*) trainer_group="${1#*=}"; shift ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) dist="$1"; shift ;;
  esac
done

[[ -n "$dist" ]] || die "no release bundle: pass DIST or set SDC_GUARD_DIST"
if [[ -n "$relay_uids" ]]; then
  [[ "$relay_uids" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--relay-uids: expected uids like 1001,1002, got '$relay_uids'"
  relay="unix:/run/sdc-agent/relay.sock"
fi
[[ -z "$pki" || -d "$pki" ]] || die "--pki $pki is not a directory"
[[ -e "$dist" ]] || die "release bundle $dist does not exist"
root="${root%/}"
live=1
[[ -z "$root" ]] || live=0

# --- Node role -------------------------------------------------------------

find_provisioning_parameters() {
  local candidate
  for candidate in "${SDC_PROVISIONING_PARAMETERS:-}" ./provisioning_parameters.json \
    "$script_dir/provisioning_parameters.json" "$script_dir/../provisioning_parameters.json" \
    /opt/ml/config/provisioning_parameters.json; do
    if [[ -n "$candidate" && -f "$candidate" ]]; then
      echo "$candidate"
      return 0
    fi
  done
  return 0
}

# Prints "ROLE CONTROLLER_IP" ("-" when unknown) from the resource config.
detect_with_python() {
  python3 -c '
import json, re, sys
rc_path, pp_path, ips = sys.argv[1], sys.argv[2], set(sys.argv[3].split())
with open(rc_path) as f:
    groups = json.load(f).get("InstanceGroups", [])
params = {}
if pp_path:
    with open(pp_path) as f:
        params = json.load(f)
names = [g.get("Name", "") for g in groups]
controller = params.get("controller_group") or next(
    (n for n in names if re.search("controller|head", n, re.I)), "")
login = params.get("login_group") or next((n for n in names if re.search("login", n, re.I)), "")
mine = next((g.get("Name", "") for g in groups
             for i in g.get("Instances", []) if i.get("CustomerIpAddress") in ips), None)
role = "-" if mine is None else ("controller" if mine == controller else
                                 "login" if mine == login else "compute")
ctl_ip = next((i.get("CustomerIpAddress") for g in groups if g.get("Name") == controller
               for i in g.get("Instances", []) if i.get("CustomerIpAddress")), "-")
print(role, ctl_ip)
' "$1" "$2" "$3"
}

detect_with_jq() {
  local controller="" login=""
  if [[ -n "$2" ]]; then
    controller="$(jq -r '.controller_group // ""' "$2")"
    login="$(jq -r '.login_group // ""' "$2")"
  fi
  jq -r --arg ips "$3" --arg controller "$controller" --arg login "$login" '
    (.InstanceGroups // []) as $groups
    | ($ips | split(" ") | map(select(length > 0))) as $mine
    | (if $controller != "" then $controller
       else ([$groups[].Name | select(test("controller|head"; "i"))] | first // "") end) as $ctl
    | (if $login != "" then $login
       else ([$groups[].Name | select(test("login"; "i"))] | first // "") end) as $lgn
    | ([$groups[] | .Name as $n | .Instances[]?
        | select(.CustomerIpAddress as $ip | $mine | index($ip)) | $n] | first) as $group
    | (if $group == null then "-" elif $group == $ctl then "controller"
       elif $group == $lgn then "login" else "compute" end) as $role
    | ([$groups[] | select(.Name == $ctl) | .Instances[]?.CustomerIpAddress
        | select(. != null)] | first // "-") as $ctl_ip
    | "\($role) \($ctl_ip)"' "$1"
}

controller_ip="-"
if [[ -f "$resource_config" ]]; then
  if [[ -z "$self_ip" ]]; then
    self_ip="$(hostname -I 2>/dev/null || true)"
  fi
  params_file="$(find_provisioning_parameters)"
  tool="${SDC_GUARD_JSON_TOOL:-}"
  if [[ -z "$tool" ]]; then
    if command -v python3 >/dev/null; then tool=python3; elif command -v jq >/dev/null; then tool=jq; fi
  fi
  case "$tool" in
    python3) detection="$(detect_with_python "$resource_config" "$params_file" "$self_ip")" ||
      die "cannot read $resource_config with python3: pass --role" ;;
    jq) detection="$(detect_with_jq "$resource_config" "$params_file" "$self_ip")" ||
      die "cannot read $resource_config with jq: pass --role" ;;
    *) die "neither python3 nor jq is available to read $resource_config: pass --role" ;;
  esac
  read -r detected controller_ip <<<"$detection"
  log "resource config $resource_config (${params_file:-no provisioning_parameters.json}, $tool): this node ($self_ip) is ${detected}, controller ${controller_ip}"
  if [[ -z "$role" ]]; then
    [[ "$detected" != "-" ]] || die "this node's address ($self_ip) is not in $resource_config: pass --role"
    role="$detected"
  fi
fi
[[ -n "$role" ]] || die "no role: pass --role controller|compute|login (no $resource_config)"
case "$role" in
  controller | compute | login) ;;
  *) die "unknown role '$role' (controller, compute or login)" ;;
esac
log "role: $role"

# --- Files -----------------------------------------------------------------

# The bundle: prints the unpacked bundle directory or the tarball DIST names.
find_bundle() {
  local d="$1" found=()
  if [[ -f "$d" && "$d" == *.tar.gz ]]; then
    echo "$d"
  elif [[ -f "$d/share/sdc-guard/VERSION" ]]; then
    echo "$d"
  elif [[ -d "$d" ]]; then
    shopt -s nullglob
    found=("$d"/sdc-guard-*-linux-x86_64/share/sdc-guard/VERSION)
    if ((${#found[@]} == 1)); then
      echo "${found[0]%/share/sdc-guard/VERSION}"
      return 0
    fi
    found=("$d"/sdc-guard-*-linux-x86_64.tar.gz)
    ((${#found[@]} == 1)) && echo "${found[0]}"
  fi
  return 0
}

# Unpacks or copies the bundle to $root/opt/sdc-guard/VERSION, moves
# `current` to it; prints VERSION.
install_bundle() {
  local bundle staging version
  bundle="$(find_bundle "$dist")"
  [[ -n "$bundle" ]] ||
    die "$dist is not a release bundle (sdc-guard-VERSION-linux-x86_64[.tar.gz] from ./sdc release, or a directory holding exactly one)"
  install -d -m 0755 "$root/opt/sdc-guard"
  staging="$(mktemp -d "$root/opt/sdc-guard/.install.XXXXXX")"
  if [[ -f "$bundle" ]]; then
    tar -C "$staging" --strip-components=1 --no-same-owner -xzf "$bundle" ||
      die "cannot unpack $bundle"
  else
    cp -a "$bundle/." "$staging/"
  fi
  [[ -f "$staging/share/sdc-guard/VERSION" && -d "$staging/bin" && -d "$staging/lib" ]] ||
    { rm -rf "$staging"; die "$bundle lacks share/sdc-guard/VERSION, bin/ or lib/: not a release bundle"; }
  version="$(tr -d '[:space:]' <"$staging/share/sdc-guard/VERSION")"
  [[ "$version" =~ ^[0-9A-Za-z.+-]+$ ]] || { rm -rf "$staging"; die "$bundle has a bad VERSION '$version'"; }
  rm -rf "${root:?}/opt/sdc-guard/$version"
  mv "$staging" "$root/opt/sdc-guard/$version"
  chmod 0755 "$root/opt/sdc-guard/$version"
  # Relative, so that it holds under --root as well; replaced in one rename.
  ln -sfn "$version" "$root/opt/sdc-guard/current.new"
  mv -T "$root/opt/sdc-guard/current.new" "$root/opt/sdc-guard/current"
  echo "$version"
}

# /usr/local/bin/NAME -> /opt/sdc-guard/current/bin/NAME (the bundle's launcher).
link_program() {
  local name="$1"
  [[ -x "$root/opt/sdc-guard/current/bin/$name" ]] || die "the bundle has no bin/$name"
  install -d -m 0755 "$root/usr/local/bin"
  ln -sfn "/opt/sdc-guard/current/bin/$name" "$root/usr/local/bin/$name"
  log "linked $root/usr/local/bin/$name -> /opt/sdc-guard/current/bin/$name"
}

# A unit or script: from DIST when it ships one, else from deploy/slurm.
asset() {
  local name="$1"
  if [[ -d "$dist" && -f "$dist/$name" ]]; then
    echo "$dist/$name"
  elif [[ -f "$script_dir/../$name" ]]; then
    echo "$script_dir/../$name"
  else
    die "cannot find $name in $dist or $script_dir/.."
  fi
}

run() {
  if ((live)); then
    "$@"
  else
    log "(--root) would run: $*"
  fi
}

ensure_user() {
  if ((live)) && ! getent passwd sdc >/dev/null; then
    useradd --system --user-group --home-dir /var/lib/sdc --no-create-home \
      --shell /usr/sbin/nologin --comment "sdc-guard" sdc
    log "created system user sdc"
  elif ((!live)); then
    log "(--root) would create system user sdc"
  fi
}

# --- Node identity ---------------------------------------------------------

tls_dir="$root/etc/sdc-guard/tls"

# make_ca: the cluster's CA in $pki, once (the first controller install).
make_ca() {
  if [[ -f "$pki/ca.crt" && -f "$pki/ca.key" ]]; then
    return 0
  fi
  (umask 077 && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
    -subj "/CN=sdc-guard cluster CA" -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null) ||
    die "cannot make the CA in $pki (openssl)"
  log "made the cluster CA $pki/ca.crt (key $pki/ca.key: keep it readable by root only)"
}

# issue NAME CN SANS USAGE: $tls_dir/NAME.crt and .key, signed by the CA in $pki.
issue() {
  local name="$1" cn="$2" sans="$3" usage="$4" csr
  [[ -f "$pki/ca.crt" && -f "$pki/ca.key" ]] ||
    die "no CA in $pki (ca.crt, ca.key): install the controller with --pki $pki first"
  install -d -m 0755 "$tls_dir"
  csr="$(mktemp)"
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\nbasicConstraints=CA:FALSE\n' "$sans" "$usage" >"$csr.ext"
  (umask 077 && openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$cn" \
    -keyout "$tls_dir/$name.key" -out "$csr" 2>/dev/null &&
    openssl x509 -req -in "$csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 825 \
      -extfile "$csr.ext" -out "$tls_dir/$name.crt" 2>/dev/null) ||
    { rm -f "$csr" "$csr.ext"; die "cannot issue $name's certificate (openssl)"; }
  rm -f "$csr" "$csr.ext"
  install -m 0644 "$pki/ca.crt" "$tls_dir/ca.crt"
  chmod 0644 "$tls_dir/$name.crt"
  log "issued $tls_dir/$name.crt ($sans)"
}

# key_group NAME GROUP: the key readable by root and GROUP only.
key_group() {
  if ((live)); then
    chgrp "$2" "$tls_dir/$1.key" || die "cannot give $tls_dir/$1.key to group $2"
  else
    log "(--root) would run: chgrp $2 $tls_dir/$1.key"
  fi
  chmod 0640 "$tls_dir/$1.key"
}

# The node's name as Slurm (and so the actuator and trainer-env.sh) knows it.
node_name="$(hostname)"

if [[ "$role" == compute ]]; then
  [[ -n "$torch_lib" ]] ||
    die "compute nodes need --torch-lib DIR (or SDC_TORCH_LIB): torch 2.11.0's lib/ directory, which sdc-agent links and the bundle does not carry"
  if ((live)) && [[ ! -f "$torch_lib/libtorch.so" ]]; then
    die "--torch-lib $torch_lib holds no libtorch.so"
  fi
fi
version="$(install_bundle)"
log "installed the bundle $version in $root/opt/sdc-guard/$version (current -> $version)"

install -D -m 0644 "$(asset trainer-env.sh)" "$root/usr/local/share/sdc-guard/trainer-env.sh"
log "installed $root/usr/local/share/sdc-guard/trainer-env.sh"

case "$role" in
  controller)
    ensure_user
    link_program sdcd
    link_program sdcctl
    install -D -m 0644 "$(asset sdcd.service)" "$root/etc/systemd/system/sdcd.service"
    log "installed $root/etc/systemd/system/sdcd.service"
    if [[ -n "$sdcd_user" ]]; then
      install -d -m 0755 "$root/etc/systemd/system/sdcd.service.d"
      printf '[Service]\nUser=%s\nGroup=%s\n' "$sdcd_user" "$sdcd_user" \
        >"$root/etc/systemd/system/sdcd.service.d/user.conf"
      log "sdcd runs as $sdcd_user (drop-in sdcd.service.d/user.conf)"
    else
      log "reminder: the slurm actuator needs the sdc user to be a Slurm operator:" \
        "sacctmgr -i add user sdc account=root adminlevel=operator (or rerun with --sdcd-user slurm)"
    fi
    if [[ -n "$pki" ]]; then
      make_ca
      sdcd_sans="DNS:$node_name"
      for ip in $self_ip; do sdcd_sans="$sdcd_sans,IP:$ip"; done
      issue sdcd sdcd "$sdcd_sans" serverAuth
      key_group sdcd "${sdcd_user:-sdc}"
    elif [[ ! -f "$tls_dir/sdcd.crt" ]]; then
      log "warning: no $tls_dir/sdcd.crt: sdcd.service needs ca.crt, sdcd.crt and sdcd.key there (or rerun with --pki DIR)"
    fi
    run systemctl daemon-reload
    if ((start)); then run systemctl enable --now sdcd.service; fi
    ;;
  compute)
    ensure_user
    link_program sdc-agent
    link_program sdcctl
    install -D -m 0644 "$(asset sdc-agent.service)" "$root/etc/systemd/system/sdc-agent.service"
    log "installed $root/etc/systemd/system/sdc-agent.service"
    if [[ -z "$coordinator" && "$controller_ip" != "-" ]]; then
      coordinator="${controller_ip}:7400"
    fi
    [[ -n "$coordinator" ]] ||
      die "no coordinator address for the agent: pass --coordinator HOST:PORT or set SDC_COORDINATOR"
    [[ "$coordinator" == *:* ]] || coordinator="$coordinator:7400"
    agent_coordinator="${coordinator%:*}:7402"
    if [[ -n "$pki" ]]; then
      issue node "$node_name" "DNS:$node_name" clientAuth
      key_group node "$trainer_group"
    elif [[ ! -f "$tls_dir/node.crt" ]]; then
      log "warning: no $tls_dir/node.crt: sdc-agent.service needs ca.crt, node.crt and node.key there, the certificate naming DNS:$node_name (or rerun with --pki DIR)"
    fi
    agent_flags=""
    if [[ -n "$relay_uids" ]]; then
      agent_flags="--relay_allowed_uids=$relay_uids"
      if ((live)); then
        gid="$(getent group "$trainer_group" | cut -d: -f3)" || die "no group $trainer_group (--trainer-group)"
      else
        gid="$(getent group "$trainer_group" | cut -d: -f3 || true)"
      fi
      [[ -z "$gid" ]] || agent_flags="$agent_flags --relay_group=$gid"
    fi
    # The agent reads the node's key and owns the relay socket as a member
    # of the trainers' group.
    if [[ "$trainer_group" != sdc ]]; then
      install -d -m 0755 "$root/etc/systemd/system/sdc-agent.service.d"
      printf '[Service]\nSupplementaryGroups=%s\n' "$trainer_group" \
        >"$root/etc/systemd/system/sdc-agent.service.d/group.conf"
      log "sdc-agent runs with supplementary group $trainer_group (drop-in sdc-agent.service.d/group.conf)"
    fi
    install -d -m 0755 "$root/etc/default"
    {
      echo "# Written by install_sdc_guard.sh; read by sdc-agent.service and trainer-env.sh."
      echo "SDC_COORDINATOR=$agent_coordinator"
      echo "SDC_TRAINER_COORDINATOR=$coordinator"
      echo "NODE_NAME=$node_name"
      echo "SDC_RELAY_LISTEN=$relay"
      echo "SDC_TORCH_LIB=$torch_lib"
      echo "SDC_AGENT_FLAGS=\"$agent_flags\""
    } >"$root/etc/default/sdc-agent"
    log "wrote $root/etc/default/sdc-agent (SDC_COORDINATOR=$agent_coordinator, trainers $coordinator${relay:+, SDC_RELAY_LISTEN=$relay})"
    run systemctl daemon-reload
    if ((start)); then run systemctl enable --now sdc-agent.service; fi
    ;;
  login)
    link_program sdcctl
    ;;
esac
log "done ($role, sdc-guard $version)"
