#!/bin/bash
# triage.sh: sorts what `make fuzz` found into the regression corpora.
# usage: tests/fuzz/triage.sh [loader|cli] [MINIMISE_SECONDS] [ARTIFACT_DIR]   (from the repository root, after make fuzz)
# For each artifact in build-fuzz/artifacts-<target>/: reproduce it with the
# fuzz binary and take its signature (crash kind + the first three frames
# outside the sanitizer runtime); where that frame is kvbench's own code
# (not libhdf5's H5* functions) it is a kvbench bug, reported as such. One
# input per new signature is minimised (libFuzzer -minimize_crash) into
# tests/corpus/<target>/, its signature appended to SIGNATURES there, and
# (loader) replayed against ./kvbench info: it must exit 2 naming the file.
set -u
target=${1:-loader}
secs=${2:-30}
bin=$PWD/build-fuzz/fuzz_$target
art=${3:-build-fuzz/artifacts-$target}
corp=tests/corpus/$target
mkdir -p "$corp"
touch "$corp/SIGNATURES"
export ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1
new=0 seen=0 ours=0
for a in "$art"/*; do
    [ -f "$a" ] || continue
    out=$(timeout 60 "$bin" -timeout=5 -rss_limit_mb=2560 -runs=1 "$a" 2>&1)
    kind=$(grep -oE 'ERROR: (AddressSanitizer|UndefinedBehaviorSanitizer|libFuzzer): [A-Za-z-]+|runtime error|timeout after' <<<"$out" | head -1)
    if [ -z "$kind" ]; then # depends on state left by earlier inputs: kept whole if the binary refuses it cleanly
        [ "$target" = loader ] || { echo "no longer reproduces: $a"; continue; }
        name=flaky-$(sha1sum "$a" | cut -c1-10).h5
        grep -qF "$name" "$corp/SIGNATURES" && { seen=$((seen + 1)); continue; }
        cp "$a" "$corp/$name"; printf '%s\t%s\n' "$name" "does not reproduce alone" >>"$corp/SIGNATURES"
        err=$(timeout 30 ./kvbench info "$corp/$name" 2>&1 >/dev/null); rc=$?
        echo "new: $name (does not reproduce alone): kvbench info exit $rc: ${err:0:200}"; new=$((new + 1)); continue
    fi
    # frames with a function name, outside the sanitizer/fuzzer runtime and libc
    frames=$(grep -E '^ +#[0-9]+ 0x[0-9a-f]+ in ' <<<"$out" | grep -v 'libc\.so' \
             | sed -E 's/.* in ([^ ]+).*/\1/' \
             | grep -vE '^(__|fuzzer::|LLVMFuzzer|malloc|calloc|realloc|free|abort|raise|_start|main$)' | head -3 | tr '\n' ' ')
    ub=$(grep -oE '[^ ]+:[0-9]+:[0-9]+: runtime error: [^(]*' <<<"$out" | head -1) # UBSan: where and what
    [ -n "$ub" ] && frames="${ub%%:*} $frames"
    sig="$kind | ${ub:+$ub | }$frames"
    first=$(awk '{print $1}' <<<"$frames")
    case "$kind:$first" in
    *out-of-memory*) where=oom ;; # RSS over the limit: the stack shown is the fuzzer's, not the culprit's
    *:H5*|*:) where=libhdf5 ;;
    *) where=kvbench; ours=$((ours + 1)) ;;
    esac
    if grep -qF -- "$sig" "$corp/SIGNATURES"; then seen=$((seen + 1)); continue; fi
    [ "$where" = kvbench ] && echo "KVBENCH CODE (a kvbench bug to fix): $a: $sig"
    name=$where-$(sha1sum "$a" | cut -c1-10)
    ext=; [ "$target" = loader ] && ext=.h5
    timeout $((secs + 60)) "$bin" -minimize_crash=1 -timeout=5 -max_total_time="$secs" \
        -exact_artifact_path="$corp/$name$ext" "$a" >/dev/null 2>&1
    [ -s "$corp/$name$ext" ] || cp "$a" "$corp/$name$ext"
    printf '%s\t%s\n' "$name$ext" "$sig" >>"$corp/SIGNATURES"
    new=$((new + 1))
    if [ "$target" = loader ]; then
        err=$(timeout 30 ./kvbench info "$corp/$name$ext" 2>&1 >/dev/null); rc=$?
        echo "new: $name$ext ($sig): kvbench info exit $rc: ${err:0:200}"
    else
        echo "new: $name ($sig)"
    fi
done
echo "triage $target: $new new signatures, $seen already in $corp; $ours of the inputs crashed in kvbench's own code"
