#!/usr/bin/env bash
# Builds the accelpool guest image: Debian's kernel (unpacked from its package, never installed) and an
# initramfs of busybox-static, the /init in this folder, the kernel modules the guest needs, and any extra
# statically linked programs. See docs/guest-image.md.
#
# Usage: build-guest.sh [--cache DIR] [--kernel-package NAME] [--soft] OUT_DIR [FILE[:GUEST_PATH]...]
#
#   OUT_DIR            receives vmlinux (uncompressed kernel for PVH boot, when the kernel supports it),
#                      vmlinuz (the bzImage), initramfs.cpio.gz, kernel.release and modules.txt
#   FILE               a statically linked program (or a #! script for the guest's busybox sh) copied to
#                      /usr/bin/<name>, or to GUEST_PATH when given (e.g. run.sh:/etc/accelpool/run)
#   --cache DIR        where the kernel package and its unpacked files are kept (default OUT_DIR/cache, or
#                      $ACCELPOOL_GUEST_CACHE); a package already there is never downloaded again
#   --kernel-package   the kernel package (default: what linux-image-amd64 depends on, or
#                      $ACCELPOOL_GUEST_KERNEL_PACKAGE)
#   --soft             when the kernel package cannot be had (no apt, no network) or a host tool is missing,
#                      write the reason to OUT_DIR/UNAVAILABLE and exit 0 instead of failing; tests read it
#                      and say why they are skipped
#
# Idempotent: outputs that would not change are left untouched (same bytes, same modification time).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache="${ACCELPOOL_GUEST_CACHE:-}"
kernel_package="${ACCELPOOL_GUEST_KERNEL_PACKAGE:-}"
soft=0
out=""
extras=()

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }
die() { echo "build-guest: error: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --cache) [ $# -ge 2 ] || die "--cache needs a folder"; cache="$2"; shift 2 ;;
    --kernel-package) [ $# -ge 2 ] || die "--kernel-package needs a package name"; kernel_package="$2"; shift 2 ;;
    --soft) soft=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) if [ -z "$out" ]; then out="$1"; else extras+=("$1"); fi; shift ;;
  esac
done
while [ $# -gt 0 ]; do
  if [ -z "$out" ]; then out="$1"; else extras+=("$1"); fi
  shift
done
[ -n "$out" ] || { usage >&2; die "OUT_DIR is missing"; }

# A missing prerequisite outside this project: fatal, or recorded for the tests with --soft.
unavailable() {
  if [ "$soft" = 1 ]; then
    echo "$*" >"$out/UNAVAILABLE"
    echo "build-guest: guest image unavailable: $*" >&2
    exit 0
  fi
  die "$*"
}

# Bad arguments are always fatal, and checked before anything is created or downloaded.
declare -a extra_src=() extra_dst=()
for spec in "${extras[@]+"${extras[@]}"}"; do
  src="${spec%%:*}"
  if [ "$src" = "$spec" ]; then dst="/usr/bin/$(basename "$src")"; else dst="${spec#*:}"; fi
  [ -f "$src" ] || die "extra file '$src' does not exist"
  case "$dst" in
    /*) ;;
    *) die "guest path '$dst' (for '$src') must be absolute" ;;
  esac
  case "$dst" in
    /init|/bin/busybox|*/../*|*/..) die "guest path '$dst' (for '$src') is reserved or not canonical" ;;
  esac
  if [ "$(head -c 4 "$src" | od -An -c | tr -d ' \n')" = "177ELF" ]; then
    command -v readelf >/dev/null 2>&1 || die "readelf (binutils) is needed to check that '$src' is static"
    # (Output into a variable, not a pipe into `grep -q`: under pipefail, grep leaving at the first match can
    # make the writer die of SIGPIPE and the pipe count as failed, at random.)
    headers=$(readelf -l "$src" 2>/dev/null || true)
    if grep -q 'Requesting program interpreter' <<<"$headers"; then
      die "'$src' is dynamically linked; the guest has no C library: link it statically (-static)"
    fi
  elif [ "$(head -c 2 "$src")" != "#!" ]; then
    die "'$src' is neither an ELF program nor a #! script"
  fi
  extra_src+=("$(cd "$(dirname "$src")" && pwd)/$(basename "$src")")
  extra_dst+=("$dst")
done

mkdir -p "$out"
out=$(cd "$out" && pwd)
[ -n "$cache" ] || cache="$out/cache"
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
# Images built at the same time (several CMake targets, parallel test runs) share the cache: one at a time.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$cache/.lock"
  flock 9
fi

for tool in busybox cpio gzip dpkg readelf objcopy xz perl; do
  command -v "$tool" >/dev/null 2>&1 || unavailable "'$tool' is not installed (run scripts/setup.sh)"
done
applets=$(busybox --list 2>/dev/null || true)
if ! grep -qx uevent <<<"$applets" || ! file_is_static=$(readelf -l "$(command -v busybox)" 2>&1) ||
   grep -q 'Requesting program interpreter' <<<"$file_is_static"; then
  unavailable "$(command -v busybox) is not a static busybox with the needed applets (install busybox-static)"
fi

# --- the kernel package --------------------------------------------------------------------------------------
if [ -z "$kernel_package" ] && command -v apt-cache >/dev/null 2>&1; then
  kernel_package=$(apt-cache depends linux-image-amd64 2>/dev/null |
                   sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -n 1 || true)
fi
if [ -z "$kernel_package" ]; then
  # No package lists: fall back to the newest package already in the cache.
  newest=$(ls -1t "$cache"/linux-image-*_amd64.deb 2>/dev/null | head -n 1 || true)
  [ -n "$newest" ] || unavailable "cannot tell which kernel package linux-image-amd64 stands for (apt-cache has no answer; run apt-get update) and none is cached in $cache"
  kernel_package=$(basename "$newest" | cut -d_ -f1)
fi
case "$kernel_package" in
  linux-image-*) ;;
  *) die "'$kernel_package' is not a linux-image package" ;;
esac

deb=$(ls -1t "$cache/${kernel_package}"_*.deb 2>/dev/null | head -n 1 || true)
if [ -z "$deb" ]; then
  command -v apt-get >/dev/null 2>&1 || unavailable "apt-get is not available to download $kernel_package"
  echo "build-guest: downloading $kernel_package into $cache" >&2
  tmp_dl=$(mktemp -d "$cache/download.XXXXXX")
  if ! apt_log=$(cd "$tmp_dl" && apt-get download -q -o APT::Sandbox::User=root "$kernel_package" 2>&1); then
    rm -rf "$tmp_dl"
    apt_errors=$(grep -E '^(E|W):' <<<"$apt_log" | head -n 3 | tr '\n' ' ' || true)
    unavailable "apt-get download $kernel_package failed (no network or no package lists?): ${apt_errors:-$apt_log}"
  fi
  echo "$apt_log" >&2
  mv "$tmp_dl"/*.deb "$cache/"
  rm -rf "$tmp_dl"
  deb=$(ls -1t "$cache/${kernel_package}"_*.deb | head -n 1)
fi

# --- the kernel kit -----------------------------------------------------------------------------------------
# What the image takes from the package, kept in the cache: the bzImage, the uncompressed kernel, the module
# tables and only the modules the guest loads. The rest of the package (~430 MB unpacked) is thrown away.
#
# virtio_pci: the virtio transport; virtio_console: virtio-serial ports. PCI hot-plug on machine pc (acpiphp,
# shpchp) is built into Debian's kernel; a kernel that has them as modules gets them loaded too. The
# ivshmem-plain device needs no driver to appear under /sys/bus/pci/devices.
wanted=(virtio_pci virtio_console acpiphp shpchp)
kit="$cache/${kernel_package}"
kit_key="$(basename "$deb") modules: ${wanted[*]} (kit 1)"

# The bzImage carries the kernel as one compressed ELF file; find the stream by its magic and unpack it, as the
# kernel's own scripts/extract-vmlinux does. PVH boot needs the Xen PHYS32_ENTRY note (CONFIG_PVH).
extract_vmlinux() {
  local image="$1" dest="$2" magic tool off
  for pair in '\xfd7zXZ\x00:xz -dc --single-stream' '\x28\xb5\x2f\xfd:zstd -dc' '\x1f\x8b\x08:gzip -dc' \
              '\x02\x21\x4c\x18:lz4 -dc'; do
    magic="${pair%%:*}"
    tool="${pair#*:}"
    command -v "${tool%% *}" >/dev/null 2>&1 || continue
    for off in $(LC_ALL=C grep -obUaP "$magic" "$image" 2>/dev/null | cut -d: -f1 | head -n 5); do
      tail -c +$((off + 1)) "$image" | $tool >"$dest" 2>/dev/null || true
      if [ "$(head -c 4 "$dest" | od -An -c | tr -d ' \n')" = "177ELF" ]; then return 0; fi
    done
  done
  rm -f "$dest"
  return 1
}
has_pvh_note() {
  local notes xen
  notes=$(readelf -n "$1" 2>/dev/null || true)
  xen=$(grep -E '^ *Xen ' <<<"$notes" || true)
  grep -qE 'PHYS32_ENTRY|\(0x00000012\)' <<<"$xen"
}

modinfo_depends() {
  local ko="$1" tmp
  tmp=$(mktemp)
  case "$ko" in
    *.ko) objcopy -O binary --only-section=.modinfo "$ko" "$tmp" ;;
    *.ko.xz) xz -dc "$ko" >"$tmp.ko" && objcopy -O binary --only-section=.modinfo "$tmp.ko" "$tmp"; rm -f "$tmp.ko" ;;
    *.ko.zst) zstd -qdc "$ko" >"$tmp.ko" && objcopy -O binary --only-section=.modinfo "$tmp.ko" "$tmp"; rm -f "$tmp.ko" ;;
    *) die "unknown module format: $ko" ;;
  esac
  tr '\0' '\n' <"$tmp" | sed -n 's/^depends=//p' | tr ',' ' '
  rm -f "$tmp"
}

# resolve MODDIR: fills load_order (modules, dependencies first), deps_of, path_of and builtin_used.
declare -A path_of=() builtin=() state=() deps_of=()
load_order=()
builtin_used=()
visit() {
  local name="${1//-/_}" dep deps
  [ "${state[$name]:-0}" = 2 ] && return 0
  [ "${state[$name]:-0}" = 1 ] && die "module dependency cycle at $name"
  if [ -z "${path_of[$name]:-}" ]; then
    [ -n "${builtin[$name]:-}" ] || die "module $name is neither built into $release nor shipped in $(basename "$deb")"
    builtin_used+=("$name")
    state[$name]=2
    return 0
  fi
  state[$name]=1
  deps=$(modinfo_depends "$resolve_dir/${path_of[$name]}")
  deps_of[$name]="$deps"
  for dep in $deps; do visit "$dep"; done
  state[$name]=2
  load_order+=("$name")
}
resolve() {
  resolve_dir="$1"
  path_of=(); builtin=(); state=(); deps_of=(); load_order=(); builtin_used=()
  local rel name
  while read -r rel; do
    name="${rel##*/}"; name="${name%%.ko*}"; name="${name//-/_}"
    path_of[$name]="$rel"
  done <"$resolve_dir/modules.order"
  while read -r rel; do
    name="${rel##*/}"; name="${name%%.ko*}"; name="${name//-/_}"
    builtin[$name]=1
  done <"$resolve_dir/modules.builtin"
  for name in "${wanted[@]}"; do visit "$name"; done
}

if [ "$(cat "$kit/.from" 2>/dev/null || true)" != "$kit_key" ]; then
  echo "build-guest: unpacking $(basename "$deb")" >&2
  rm -rf "$kit" "$kit.tmp" "$kit.new"
  dpkg -x "$deb" "$kit.tmp"
  release=$(ls -1 "$kit.tmp/lib/modules" 2>/dev/null | head -n 1)
  [ -n "$release" ] || die "$deb has no /lib/modules"
  [ -f "$kit.tmp/boot/vmlinuz-$release" ] || die "$deb has no /boot/vmlinuz-$release"
  resolve "$kit.tmp/lib/modules/$release"
  mkdir -p "$kit.new/boot" "$kit.new/lib/modules/$release"
  cp "$kit.tmp/boot/vmlinuz-$release" "$kit.tmp/boot/config-$release" "$kit.new/boot/"
  cp "$kit.tmp/lib/modules/$release/modules.order" "$kit.tmp/lib/modules/$release/modules.builtin" \
     "$kit.new/lib/modules/$release/"
  for name in "${load_order[@]+"${load_order[@]}"}"; do
    mkdir -p "$kit.new/lib/modules/$release/$(dirname "${path_of[$name]}")"
    cp "$kit.tmp/lib/modules/$release/${path_of[$name]}" "$kit.new/lib/modules/$release/${path_of[$name]}"
  done
  if extract_vmlinux "$kit.new/boot/vmlinuz-$release" "$kit.new/vmlinux.tmp" && has_pvh_note "$kit.new/vmlinux.tmp"; then
    mv "$kit.new/vmlinux.tmp" "$kit.new/vmlinux"
  else
    rm -f "$kit.new/vmlinux.tmp"
    echo "build-guest: $release has no uncompressed kernel with a PVH entry: only vmlinuz (slower boot)" >&2
  fi
  echo "$kit_key" >"$kit.new/.from"
  mv "$kit.new" "$kit"
  rm -rf "$kit.tmp"
fi

release=$(ls -1 "$kit/lib/modules" | head -n 1)
moddir="$kit/lib/modules/$release"
vmlinuz="$kit/boot/vmlinuz-$release"
vmlinux="$kit/vmlinux"
resolve "$moddir"

# --- the initramfs -------------------------------------------------------------------------------------------
stage=$(mktemp -d "$out/.stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root="$stage/root"
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,usr/libexec/accelpool,etc/accelpool,proc,sys,dev,tmp,run,root}
cp "$(command -v busybox)" "$root/bin/busybox"
# One symbolic link per applet (/sbin/insmod -> /bin/busybox, ...), made in one process: hundreds of ln calls
# are slow on a busy machine. linuxrc is left out: the kernel runs /init.
busybox --list-full | grep -vxE 'bin/busybox|linuxrc' |
  (cd "$root" && perl -ne 'chomp; -e $_ or symlink("/bin/busybox", $_) or die "symlink $_: $!\n"')
install -m 0755 "$here/init" "$root/init"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
install -m 0755 "$here/pci-event" "$root/usr/libexec/accelpool/pci-event"

kroot="$root/lib/modules/$release"
mkdir -p "$kroot"
: >"$root/etc/accelpool/modules.load"
: >"$kroot/modules.dep"
for name in "${load_order[@]+"${load_order[@]}"}"; do
  rel="${path_of[$name]}"
  mkdir -p "$kroot/$(dirname "$rel")"
  cp "$moddir/$rel" "$kroot/$rel"
  echo "$rel" >>"$root/etc/accelpool/modules.load"
  line="$rel:"
  for dep in ${deps_of[$name]}; do
    dep="${dep//-/_}"
    [ -n "${path_of[$dep]:-}" ] && [ -z "${builtin[$dep]:-}" ] && line="$line ${path_of[$dep]}"
  done
  echo "$line" >>"$kroot/modules.dep"
done
cp "$moddir/modules.builtin" "$moddir/modules.order" "$kroot/"

for i in "${!extra_src[@]}"; do
  dst="$root${extra_dst[$i]}"
  mkdir -p "$(dirname "$dst")"
  install -m 0755 "${extra_src[$i]}" "$dst"
done

# Reproducible archive: sorted names, owner root, one fixed time, no gzip time stamp.
find "$root" -exec touch -h -d @0 {} +
(cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --reproducible --quiet) | gzip -n >"$stage/initramfs.cpio.gz"

{
  echo "kernel package: $(basename "$deb")"
  echo "kernel release: $release"
  echo "loaded modules (in order): ${load_order[*]:-none}"
  echo "built into the kernel: ${builtin_used[*]:-none}"
  for i in "${!extra_src[@]}"; do echo "extra: ${extra_src[$i]} -> ${extra_dst[$i]}"; done
} >"$stage/modules.txt"
echo "$release" >"$stage/kernel.release"

# Replace an output only when its bytes change.
publish() {
  local from="$1" name="$2"
  if [ -f "$out/$name" ] && cmp -s "$from" "$out/$name"; then return 0; fi
  if ln -f "$from" "$out/$name.tmp" 2>/dev/null; then :; else cp "$from" "$out/$name.tmp"; fi
  mv -f "$out/$name.tmp" "$out/$name"
}
publish "$vmlinuz" vmlinuz
if [ -f "$vmlinux" ]; then publish "$vmlinux" vmlinux; else rm -f "$out/vmlinux"; fi
publish "$stage/initramfs.cpio.gz" initramfs.cpio.gz
publish "$stage/modules.txt" modules.txt
publish "$stage/kernel.release" kernel.release
rm -f "$out/UNAVAILABLE"
echo "build-guest: $out: kernel $release$([ -f "$out/vmlinux" ] && echo ' (vmlinux for PVH boot)'), initramfs $(stat -c %s "$out/initramfs.cpio.gz") bytes" >&2
