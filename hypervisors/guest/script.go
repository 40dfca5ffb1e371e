package guest

// Where the recorded-command wrapper keeps things in the guest. Records
// must outlive a guest crash, so they are on the guest's disk; claims and
// staged files are per boot, so they are on tmpfs.
const (
	// WrapperPath is where the wrapper script is delivered (it is run as
	// "/bin/sh WrapperPath", so a noexec /run does not matter).
	WrapperPath = "/run/bigfleet/op-v1.sh"
	// RecordDir holds one directory per recorded command key: started
	// (boot id and runner pid), exit (its status), out (its output tail),
	// superseded.
	RecordDir = "/var/lib/bigfleet/ops"
	// ClaimDir holds one claim per key for the current boot (a symlink
	// naming the claimant's pid).
	ClaimDir = "/run/bigfleet/ops"
	// StageDir holds files staged for a command (the bootstrap blob),
	// named by key, until the wrapper moves them into place.
	StageDir = "/run/bigfleet/stage"
	// OutputTail is how much of a recorded command's output the record
	// keeps.
	OutputTail = 4096
	// RecordDays is how long a record is kept: far longer than any
	// operation's deadline, so no operation still in flight loses its
	// record.
	RecordDays = 30
)

// Script is the wrapper: a POSIX sh script, delivered through the agent's
// file write like the blob, that runs a command at most once per key and
// records in the guest, durably, that it started and how it ended. Its
// report is the first line of its stdout, "bigfleet-op v1 STATE [ARG]",
// followed by the recorded output for an exited command:
//
//	exited N     the command ran to exit with status N (now or earlier)
//	running PID  it started and its runner (PID) is alive in this boot
//	starting PID PID claimed the key in this boot and has not started it yet
//	dead PID     it started, and its runner died without recording an end
//	dead rebooted it started in an earlier boot and never recorded an end
//	lost         a claimant died before starting it: it never started, and
//	             never can under this key in this boot
//	superseded   a later attempt replaced this key; it never runs
//	noblob       -b named a staged file that is not there; nothing claimed
//
// The order that makes a record trustworthy: the claim (a symlink, atomic)
// excludes every other runner in this boot; "started" is written to a
// temporary file, fsynced, renamed and its directory fsynced before the
// command starts; "exit" likewise after it ended. So after a guest crash a
// missing "started" proves the command never ran, and a "started" without
// "exit" is an outcome that cannot be learned. A run in an earlier boot is
// recognised by the boot id in "started" (/proc/sys/kernel/random/boot_id;
// BIGFLEET_BOOT_ID overrides it for tests).
const Script = `# bigfleet guest-op v1: runs a command at most once per key and records,
# durably, that it started and how it ended (see package guest).
# usage: sh op-v1.sh run RECORDS CLAIMS KEY [-b STAGED TARGET] [-s PREVIOUS] [-r] -- ARGV...
set -u
umask 077
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
if [ "$#" -lt 5 ] || [ "$1" != run ]; then echo "op-v1.sh: usage: run RECORDS CLAIMS KEY [opts] -- ARGV" >&2; exit 2; fi
rec=$2 claims=$3 key=$4
shift 4
staged='' target='' prev='' repeat=''
while [ "$#" -gt 0 ]; do
	case $1 in
	-b) staged=$2 target=$3; shift 3 ;;
	-s) prev=$2; shift 2 ;;
	-r) repeat=1; shift ;;
	--) shift; break ;;
	*) echo "op-v1.sh: unknown option $1" >&2; exit 2 ;;
	esac
done
case $key$prev in *[!A-Za-z0-9._-]*) echo "op-v1.sh: bad key" >&2; exit 2 ;; esac
[ -n "$key" ] && [ "$#" -gt 0 ] || { echo "op-v1.sh: no key or no command" >&2; exit 2; }
boot=${BIGFLEET_BOOT_ID:-}
[ -n "$boot" ] || boot=$(cat /proc/sys/kernel/random/boot_id) && [ -n "$boot" ] || { echo "op-v1.sh: cannot read the boot id" >&2; exit 3; }
r=$rec/$key l=$claims/$key
# The first use makes the records directory durable with everything above it.
[ -d "$rec" ] || { mkdir -p -- "$rec" && sync; } || exit 3
mkdir -p -- "$claims" || exit 3

# fsync what is given (a whole-system sync where sync takes no files); a
# repeatable check is not made durable.
fsync() {
	[ -n "$repeat" ] && return 0
	sync -- "$@" 2>/dev/null || sync
}
# put FILE VALUE: write, fsync, rename into place, fsync the directory.
put() {
	printf '%s\n' "$2" > "$1.tmp" && fsync "$1.tmp" && mv -f -- "$1.tmp" "$1" && fsync "${1%/*}"
}
# alive PID: PID is a runner of this key ("sh op-v1.sh run RECORDS CLAIMS
# KEY ...": the key is its sixth argument).
alive() {
	[ -n "$1" ] && [ -r "/proc/$1/cmdline" ] &&
		[ "$(tr '\0' '\n' < "/proc/$1/cmdline" 2>/dev/null | sed -n 6p)" = "$key" ]
}
state() {
	if [ -f "$r/exit" ]; then echo "exited $(cat -- "$r/exit")"; return; fi
	if [ -f "$r/superseded" ]; then echo superseded; return; fi
	if [ -f "$r/started" ]; then
		sboot='' spid=''
		read -r sboot spid < "$r/started" || true
		if [ "$sboot" = "$boot" ] && alive "$spid"; then echo "running $spid"; return; fi
		if [ -f "$r/exit" ]; then echo "exited $(cat -- "$r/exit")"; return; fi
		if [ "$sboot" = "$boot" ]; then echo "dead $spid"; else echo "dead rebooted"; fi
		return
	fi
	if [ -L "$l" ]; then
		holder=$(readlink -- "$l")
		if alive "$holder"; then echo "starting $holder"; return; fi
		# The claimant is dead, so nothing changes any more: look again.
		if [ -f "$r/started" ] || [ -f "$r/exit" ]; then state; return; fi
		echo lost
		return
	fi
	echo none
}
report() {
	s=$(state)
	echo "bigfleet-op v1 $s"
	case $s in exited*) cat -- "$r/out" 2>/dev/null ;; esac
}

if [ -n "$repeat" ]; then
	# A read-only check, run again each time: one at a time per key.
	if ! ln -s "$$" "$l" 2>/dev/null; then
		holder=$(readlink -- "$l")
		if alive "$holder"; then echo "bigfleet-op v1 running $holder"; exit 0; fi
		rm -f -- "$l"
		ln -s "$$" "$l" 2>/dev/null || { echo "bigfleet-op v1 starting"; exit 0; }
	fi
	mkdir -p -- "$r" && rm -f -- "$r/exit" "$r/out" && printf '%s %s\n' "$boot" "$$" > "$r/started" || { rm -f -- "$l"; exit 3; }
else
	s=$(state)
	case $s in
	none) ;;
	exited* | running* | dead*)
		# Started already: a file staged again for it is not needed.
		[ -z "$staged" ] || rm -f -- "$staged"
		report; exit 0 ;;
	*) report; exit 0 ;;
	esac
	# The claim: nobody else starts KEY in this boot.
	if ! ln -s "$$" "$l" 2>/dev/null; then report; exit 0; fi
	# Records live 30 days (far longer than any operation's deadline).
	find "$rec" -path "$rec/*" -prune -mtime +30 -exec rm -rf -- {} + 2>/dev/null
	if [ -f "$r/started" ] || [ -f "$r/superseded" ]; then report; exit 0; fi
	if [ -n "$staged" ] && [ ! -f "$staged" ]; then rm -f -- "$l"; echo "bigfleet-op v1 noblob"; exit 0; fi
	if [ -n "$prev" ]; then
		mkdir -p -- "$rec/$prev" && fsync "$rec" && put "$rec/$prev/superseded" "$key" ||
			{ rm -f -- "$l"; echo "op-v1.sh: cannot record $prev superseded" >&2; exit 3; }
	fi
	mkdir -p -- "$r" && fsync "$rec" && put "$r/started" "$boot $$" ||
		{ rm -f -- "$l"; echo "op-v1.sh: cannot record the start of $key" >&2; exit 3; }
fi

# Started (durably): run the command, once.
if [ -n "$target" ]; then
	if ! { mkdir -p -- "${target%/*}" && mv -f -- "$staged" "$target"; }; then
		echo "op-v1.sh: could not put the staged file in place" > "$r/out"
		put "$r/exit" 126
		report
		exit 0
	fi
fi
"$@" > "$r/out" 2>&1 < /dev/null
rc=$?
[ -z "$target" ] || rm -f -- "$target"
tail -c 4096 -- "$r/out" > "$r/out.tmp" 2>/dev/null && mv -f -- "$r/out.tmp" "$r/out"
fsync "$r/out"
# Not recorded, a later reader finds it dead; this caller learns the
# outcome all the same.
put "$r/exit" "$rc" || echo "op-v1.sh: cannot record the end of $key" >&2
echo "bigfleet-op v1 exited $rc"
cat -- "$r/out" 2>/dev/null
[ -z "$repeat" ] || rm -f -- "$l"
`
