#!/bin/sh
# /etc/accelpool/run of the end-to-end guest image: starts accelpool-guestd on the virtio-serial port, then runs
# one job through accelpool-run that holds a pool FPGA for a while and reports on the console what it saw.
# Afterwards, with accelpool.probe=KIND, it acquires a device of that kind for a moment every second, for ever, and
# reports each outcome ("probe ok" / "probe failed"): the test sees from it that the guest can still reach the pool.
# Kernel command line: accelpool.guest=NAME accelpool.token=TOKEN accelpool.hold=SECONDS accelpool.delay=SECONDS
#                      accelpool.probe=KIND
say() { echo "accelpool-guest: $*"; }
uptime_s() { read -r up _ </proc/uptime; echo "$up"; }

guest="" token="" hold=1 delay=0 probe=""
read -r cmdline </proc/cmdline
for word in $cmdline; do
  case "$word" in
    accelpool.guest=*) guest="${word#accelpool.guest=}" ;;
    accelpool.token=*) token="${word#accelpool.token=}" ;;
    accelpool.hold=*) hold="${word#accelpool.hold=}" ;;
    accelpool.delay=*) delay="${word#accelpool.delay=}" ;;
    accelpool.probe=*) probe="${word#accelpool.probe=}" ;;
  esac
done
[ -n "$guest" ] && [ -n "$token" ] || { say "job: accelpool.guest and accelpool.token are required"; exit 2; }

accelpool-guestd >/dev/console 2>&1 &
tries=0
while [ ! -S /run/accelpool/guest.sock ] && [ $tries -lt 100 ]; do sleep 0.05; tries=$((tries + 1)); done
[ -S /run/accelpool/guest.sock ] || { say "job: accelpool-guestd did not start"; exit 3; }
sleep "$delay"

# The command: waits for the hot-plugged ivshmem device (vendor 0x1af4, device 0x1110) and holds it; it reports
# where it found the device and where its grant said the device is (ACCELPOOL_DEVICE_0_PCI, _ATTACH). A PCIe hot-plug
# reaches the guest's kernel only after its attention-button delay (about 5 s) and a loaded host slows that
# further: the job waits up to 120 s of guest uptime; the test's own deadline fails a hung run sooner.
job='
read -r t0 _ </proc/uptime
t0=${t0%.*}
while :; do
  read -r now _ </proc/uptime
  [ $((${now%.*} - t0)) -lt 120 ] || break
  for d in /sys/bus/pci/devices/*; do
    read -r v <"$d/vendor"; read -r p <"$d/device"
    if [ "$v" = 0x1af4 ] && [ "$p" = 0x1110 ]; then
      echo "accelpool-guest: job lease $ACCELPOOL_LEASE devices $ACCELPOOL_DEVICES sees pci ${d##*/} vendor $v device $p granted pci [$ACCELPOOL_DEVICE_0_PCI] attach $ACCELPOOL_DEVICE_0_ATTACH"
      sleep "$HOLD"
      exit 0
    fi
  done
  sleep 0.05
done
echo "accelpool-guest: job lease $ACCELPOOL_LEASE devices $ACCELPOOL_DEVICES sees no pool device"
exit 1'

say "job: $guest asks for an fpga (uptime $(uptime_s) s)"
start=$(uptime_s)
HOLD="$hold" ACCELPOOL_TOKEN="$token" ACCELPOOL_GUEST="$guest" accelpool-run --kind fpga --verbose -- sh -c "$job"
status=$?
end=$(uptime_s)
say "job: $guest done with status $status, jct $(awk "BEGIN{printf \"%.2f\", $end - $start}") s"
[ -n "$probe" ] || exit $status
while :; do
  sleep 1
  if ACCELPOOL_TOKEN="$token" ACCELPOOL_GUEST="$guest" accelpool-run --kind "$probe" --timeout 5 -- true 2>/dev/null; then
    say "job: $guest probe ok"
  else
    say "job: $guest probe failed with status $?"
  fi
done
