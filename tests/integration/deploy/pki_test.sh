#!/usr/bin/env bash
# deploy_pki: deploy/moat-pki in a temporary directory. Checks the layout
# (files, modes, names, SANs, extensions), that each leaf verifies against
# its role's intermediate alone (openssl verify -partial_chain) and NOT
# against another role's, that every trust bundle holds the roles SPEC
# says, that renew changes the serial and key but keeps names and layout,
# and that bad input fails with a message. Needs openssl (exit 77 without).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=${MOAT_REPO:-$(cd "$here/../../.." && pwd)}
pki=$repo/deploy/moat-pki
command -v openssl >/dev/null || { echo "SKIP - openssl is not installed"; exit 77; }

work=$(mktemp -d /tmp/moat-pki-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
d=$work/pki
fails=0
ok() { echo "ok - $*"; }
fail() { echo "FAIL - $*"; fails=$((fails + 1)); }
check() { # check DESCRIPTION COMMAND...
	local what=$1
	shift
	if "$@" >/dev/null 2>&1; then ok "$what"; else fail "$what"; fi
}
# refuses DESCRIPTION PATTERN COMMAND...: fails, and says PATTERN on stderr
refuses() {
	local what=$1 pat=$2 out
	shift 2
	if out=$("$@" 2>&1); then
		fail "$what: succeeded"
	elif grep -q -- "$pat" <<<"$out"; then
		ok "$what ($(head -n1 <<<"$out"))"
	else
		fail "$what: message lacks '$pat': $out"
	fi
}
mode() { stat -c %a "$1"; }
cn_of() { openssl x509 -in "$1" -noout -subject -nameopt multiline | sed -n 's/^ *commonName *= //p'; }
sans_of() { openssl x509 -in "$1" -noout -ext subjectAltName | tail -n +2 | sed 's/^ *//'; }
# The first certificate of a bundle (the leaf of cert.pem).
first() { openssl x509 -in "$1"; }
# subjects BUNDLE: the CNs of every certificate in it, sorted, one line.
subjects() {
	openssl crl2pkcs7 -nocrl -certfile "$1" | openssl pkcs7 -print_certs -noout |
		sed -n 's/^subject=.*CN *= *//p' | sort | tr '\n' ' ' | sed 's/ $//'
}
# verifies LEAF_BUNDLE CA_FILE [PURPOSE]: the leaf against CA_FILE alone.
verifies() {
	openssl verify -partial_chain -CAfile "$2" ${3:+-purpose "$3"} \
		<(first "$1") >/dev/null 2>&1
}

# ---- help, init ----
check "help prints the usage" bash -c "'$pki' help | grep -q 'init DIR'"
check "init makes the CA" "$pki" init "$d"
for f in root gateway vmd sessiond snapd client; do
	[ -f "$d/ca/$f.crt" ] && [ -f "$d/ca/$f.key" ] || fail "init: no ca/$f.{crt,key}"
	[ "$(mode "$d/ca/$f.key")" = 600 ] || fail "ca/$f.key mode $(mode "$d/ca/$f.key"), not 600"
done
ok "ca/{root,gateway,vmd,sessiond,snapd,client}.{crt,key}, keys 0600"
if openssl x509 -in "$d/ca/root.crt" -noout -text | grep -q 'CA:TRUE' &&
	openssl x509 -in "$d/ca/vmd.crt" -noout -text | grep -q 'CA:TRUE, pathlen:0' &&
	openssl x509 -in "$d/ca/vmd.crt" -noout -text | grep -q 'Certificate Sign'; then
	ok "root and intermediates are CAs (intermediates pathlen:0, keyCertSign)"
else
	fail "CA extensions"
fi
check "intermediates verify against the root" \
	openssl verify -CAfile "$d/ca/root.crt" "$d/ca/gateway.crt" "$d/ca/vmd.crt" \
	"$d/ca/sessiond.crt" "$d/ca/snapd.crt" "$d/ca/client.crt"
if openssl pkey -in "$d/ca/root.key" -noout -text 2>/dev/null | grep -q 'prime256v1\|P-256'; then
	ok "keys are EC P-256"
else
	fail "root key is not EC P-256"
fi
days_left() { # days until notAfter
	echo $((($(date -d "$(openssl x509 -in "$1" -noout -enddate | cut -d= -f2)" +%s) - $(date +%s)) / 86400))
}
r=$(days_left "$d/ca/root.crt") i=$(days_left "$d/ca/vmd.crt")
if [ "$r" -ge 3648 ] && [ "$r" -le 3650 ] && [ "$i" -ge 363 ] && [ "$i" -le 365 ]; then
	ok "default validity: root ~3650 days ($r), intermediates ~365 ($i)"
else
	fail "validity: root $r days, intermediate $i"
fi

# ---- issue: one instance of each role ----
"$pki" issue "$d" gateway gw-1 --san 127.0.1.1 >/dev/null &&
	"$pki" issue "$d" vmd node-a >/dev/null &&
	"$pki" issue "$d" vmd node-b --days 7 >/dev/null &&
	"$pki" issue "$d" sessiond sessiond >/dev/null &&
	"$pki" issue "$d" snapd snap-1 --san snapd.moat.svc >/dev/null &&
	"$pki" issue "$d" client alice >/dev/null &&
	ok "issue of every role" || fail "issue of every role"

declare -A expect_files=(
	[gateway/gw-1]="ca.pem cert.pem key.pem moat.conf peer-ca.pem survey-ca.pem"
	[vmd/node-a]="ca.pem cert.pem key.pem moat.conf peer-ca.pem snapshot.key"
	[sessiond/sessiond]="ca.pem cert.pem key.pem moat.conf peer-ca.pem"
	[snapd/snap-1]="ca.pem cert.pem key.pem moat.conf peer-ca.pem"
	[client/alice]="ca.pem cert.pem env.sh key.pem"
)
for inst in "${!expect_files[@]}"; do
	got=$(ls "$d/$inst" | tr '\n' ' ' | sed 's/ $//')
	[ "$got" = "${expect_files[$inst]}" ] || fail "$inst holds '$got', not '${expect_files[$inst]}'"
	[ "$(mode "$d/$inst/key.pem")" = 600 ] || fail "$inst/key.pem mode $(mode "$d/$inst/key.pem")"
	[ "$(openssl x509 -in "$d/$inst/cert.pem" -noout -pubkey | sha256sum)" = \
		"$(openssl pkey -in "$d/$inst/key.pem" -pubout | sha256sum)" ] ||
		fail "$inst: key.pem does not match cert.pem"
	n=$(grep -c 'BEGIN CERTIFICATE' "$d/$inst/cert.pem")
	[ "$n" = 2 ] || fail "$inst/cert.pem holds $n certificates, not leaf + intermediate"
done
ok "files of each instance, key.pem 0600 and matching, cert.pem = leaf + intermediate"

# The cluster's snapshot key: made once, 32 bytes, 0600, the same on
# every node, and named by the vmd fragment.
[ "$(stat -c %s "$d/ca/snapshot.key")" = 32 ] && [ "$(mode "$d/ca/snapshot.key")" = 600 ] &&
	[ "$(mode "$d/vmd/node-a/snapshot.key")" = 600 ] &&
	cmp -s "$d/vmd/node-a/snapshot.key" "$d/vmd/node-b/snapshot.key" &&
	cmp -s "$d/vmd/node-a/snapshot.key" "$d/ca/snapshot.key" &&
	grep -qx "snapshot-key-file = $d/vmd/node-a/snapshot.key" "$d/vmd/node-a/moat.conf" &&
	! grep -q snapshot-key "$d/gateway/gw-1/moat.conf" &&
	ok "snapshot.key: one 32-byte key (0600) copied to every vmd, named in its moat.conf" ||
	fail "snapshot.key: $(ls -l "$d/ca/snapshot.key" "$d"/vmd/*/snapshot.key 2>&1)"

# Names: CN=NAME, DNS:NAME, the role's name for gateway/sessiond/snapd.
declare -A expect_sans=(
	[gateway/gw-1]="DNS:gw-1, DNS:gateway, IP Address:127.0.1.1"
	[vmd/node-a]="DNS:node-a"
	[sessiond/sessiond]="DNS:sessiond"
	[snapd/snap-1]="DNS:snap-1, DNS:snapd, DNS:snapd.moat.svc"
	[client/alice]="DNS:alice"
)
for inst in "${!expect_sans[@]}"; do
	[ "$(cn_of "$d/$inst/cert.pem")" = "${inst#*/}" ] || fail "$inst: CN $(cn_of "$d/$inst/cert.pem")"
	[ "$(sans_of "$d/$inst/cert.pem")" = "${expect_sans[$inst]}" ] ||
		fail "$inst: SANs '$(sans_of "$d/$inst/cert.pem")', not '${expect_sans[$inst]}'"
done
ok "CN and SANs of each role"
t=$(openssl x509 -in "$d/vmd/node-a/cert.pem" -noout -text)
grep -q 'CA:FALSE' <<<"$t" && grep -q 'Digital Signature' <<<"$t" &&
	grep -q 'TLS Web Server Authentication, TLS Web Client Authentication' <<<"$t" &&
	ok "service leaf: CA:FALSE, digitalSignature, serverAuth+clientAuth" ||
	fail "service leaf extensions: $t"
t=$(openssl x509 -in "$d/client/alice/cert.pem" -noout -text)
grep -q 'TLS Web Client Authentication' <<<"$t" && ! grep -q 'Server Authentication' <<<"$t" &&
	ok "client leaf: clientAuth only" || fail "client leaf extensions"
l=$(days_left "$d/vmd/node-a/cert.pem") l7=$(days_left "$d/vmd/node-b/cert.pem")
[ "$l" -ge 28 ] && [ "$l" -le 30 ] && [ "$l7" -ge 5 ] && [ "$l7" -le 7 ] &&
	ok "leaf validity: 30 days by default ($l), --days 7 ($l7)" ||
	fail "leaf validity $l / $l7"

# ---- roles: each leaf verifies against its own intermediate alone ----
roles=(gateway vmd sessiond snapd client)
declare -A leaf_of=([gateway]=gateway/gw-1 [vmd]=vmd/node-a [sessiond]=sessiond/sessiond
	[snapd]=snapd/snap-1 [client]=client/alice)
for role in "${roles[@]}"; do
	leaf=$d/${leaf_of[$role]}/cert.pem
	verifies "$leaf" "$d/ca/$role.crt" || fail "$role leaf does not verify against the $role intermediate"
	for other in "${roles[@]}"; do
		[ "$other" = "$role" ] && continue
		! verifies "$leaf" "$d/ca/$other.crt" ||
			fail "$role leaf verifies against the $other intermediate"
	done
	openssl verify -CAfile "$d/ca/root.crt" -untrusted "$d/ca/$role.crt" <(first "$leaf") >/dev/null 2>&1 ||
		fail "$role leaf does not chain to the root"
done
ok "each leaf verifies against its role's intermediate alone, against no other role's, and chains to the root"
check "a vmd leaf passes as an SSL server and client (purpose sslserver, sslclient)" \
	bash -c "openssl verify -partial_chain -CAfile '$d/ca/vmd.crt' -purpose sslserver <(openssl x509 -in '$d/vmd/node-a/cert.pem') &&
		openssl verify -partial_chain -CAfile '$d/ca/vmd.crt' -purpose sslclient <(openssl x509 -in '$d/vmd/node-a/cert.pem')"
! verifies "$d/client/alice/cert.pem" "$d/ca/client.crt" sslserver &&
	ok "a client leaf is no SSL server" || fail "a client leaf passes as an SSL server"

# ---- trust bundles: the roles SPEC names ----
declare -A expect_bundle=(
	[gateway/gw-1/ca.pem]="moat sessiond CA moat snapd CA moat vmd CA"
	[gateway/gw-1/peer-ca.pem]="moat client CA"
	[gateway/gw-1/survey-ca.pem]="moat vmd CA"
	[vmd/node-a/ca.pem]="moat gateway CA moat snapd CA"
	[vmd/node-a/peer-ca.pem]="moat gateway CA"
	[sessiond/sessiond/ca.pem]="moat root CA"
	[sessiond/sessiond/peer-ca.pem]="moat gateway CA"
	[snapd/snap-1/ca.pem]="moat root CA"
	[snapd/snap-1/peer-ca.pem]="moat gateway CA moat vmd CA"
	[client/alice/ca.pem]="moat gateway CA"
)
for b in "${!expect_bundle[@]}"; do
	got=$(subjects "$d/$b")
	[ "$got" = "${expect_bundle[$b]}" ] || fail "$b holds '$got', not '${expect_bundle[$b]}'"
done
ok "ca.pem, peer-ca.pem, survey-ca.pem hold the intermediates of the right roles"
# snapd trusts callers with vmd or gateway certificates, sessiond vmd's not.
verifies "$d/vmd/node-a/cert.pem" "$d/snapd/snap-1/peer-ca.pem" &&
	! verifies "$d/vmd/node-a/cert.pem" "$d/sessiond/sessiond/peer-ca.pem" &&
	! verifies "$d/vmd/node-a/cert.pem" "$d/vmd/node-b/peer-ca.pem" &&
	verifies "$d/gateway/gw-1/cert.pem" "$d/sessiond/sessiond/peer-ca.pem" &&
	ok "peer-ca.pem: snapd takes vmd, sessiond and vmd do not" ||
	fail "peer-ca.pem role checks"

# ---- moat.conf / env.sh ----
c=$d/gateway/gw-1/moat.conf
abs=$(cd "$d" && pwd)/gateway/gw-1
grep -qx '\[gateway\]' "$c" && grep -qx "tls-cert = $abs/cert.pem" "$c" &&
	grep -qx "tls-key = $abs/key.pem" "$c" && grep -qx "tls-ca = $abs/ca.pem" "$c" &&
	grep -qx "tls-peer-ca = $abs/peer-ca.pem" "$c" &&
	grep -qx "survey-tls-peer-ca = $abs/survey-ca.pem" "$c" &&
	ok "gateway moat.conf names its files by absolute path" || fail "gateway moat.conf: $(cat "$c")"
grep -qx '\[vmd\]' "$d/vmd/node-a/moat.conf" && ! grep -q survey-tls "$d/vmd/node-a/moat.conf" &&
	ok "vmd moat.conf: [vmd], no survey CA" || fail "vmd moat.conf"
"$pki" issue "$d" sessiond sess-2 --install-dir /etc/moat/tls >/dev/null &&
	grep -qx 'tls-cert = /etc/moat/tls/cert.pem' "$d/sessiond/sess-2/moat.conf" &&
	ok "--install-dir: moat.conf names the files where they will lie" || fail "--install-dir"
(. "$d/client/alice/env.sh" && [ "$MOAT_TLS_CERT" = "$(cd "$d" && pwd)/client/alice/cert.pem" ] &&
	[ -f "$MOAT_TLS_CA" ] && [ -f "$MOAT_TLS_KEY" ]) &&
	ok "client env.sh sets MOAT_TLS_CA/CERT/KEY" || fail "client env.sh"

# ---- renew ----
s0=$(openssl x509 -in "$d/gateway/gw-1/cert.pem" -noout -serial)
k0=$(sha256sum <"$d/gateway/gw-1/key.pem")
sans0=$(sans_of "$d/gateway/gw-1/cert.pem")
files0=$(ls "$d/gateway/gw-1")
if "$pki" renew "$d" gateway gw-1 --days 3 >/dev/null; then
	[ "$(openssl x509 -in "$d/gateway/gw-1/cert.pem" -noout -serial)" != "$s0" ] || fail "renew kept the serial"
	[ "$(sha256sum <"$d/gateway/gw-1/key.pem")" != "$k0" ] || fail "renew kept the key"
	[ "$(sans_of "$d/gateway/gw-1/cert.pem")" = "$sans0" ] || fail "renew changed the names"
	[ "$(ls "$d/gateway/gw-1")" = "$files0" ] || fail "renew changed the files"
	[ "$(mode "$d/gateway/gw-1/key.pem")" = 600 ] || fail "renewed key mode"
	[ "$(days_left "$d/gateway/gw-1/cert.pem")" -le 3 ] || fail "renew --days 3"
	verifies "$d/gateway/gw-1/cert.pem" "$d/ca/gateway.crt" || fail "renewed leaf does not verify"
	compgen -G "$d/.issue.*" >/dev/null && fail "renew left a temporary directory"
	ok "renew: new serial and key, same names, files, modes; verifies"
else
	fail "renew"
fi
"$pki" renew "$d" sessiond sess-2 >/dev/null &&
	grep -qx 'tls-cert = /etc/moat/tls/cert.pem' "$d/sessiond/sess-2/moat.conf" &&
	ok "renew keeps the --install-dir of moat.conf" || fail "renew lost --install-dir"
check "show lists certificates and expiry" \
	bash -c "'$pki' show '$d' | grep -q 'vmd/node-a/cert.pem *node-a *moat vmd CA' &&
		'$pki' show '$d' | grep 'vmd/node-b/cert.pem' | grep -q 'within 7 days'"

# ---- bad input ----
refuses "unknown role" "unknown role 'db'" "$pki" issue "$d" db x
refuses "existing name without --force" "exists: .*renew" "$pki" issue "$d" vmd node-a
check "existing name with --force" "$pki" issue "$d" vmd node-a --force
refuses "missing DIR" "has no ca/root.crt: run .moat-pki init" "$pki" issue "$work/none" vmd x
refuses "no DIR at all" "name the directory" "$pki" init
refuses "init over an existing CA" "already has a CA" "$pki" init "$d"
refuses "a bad name" "bad name" "$pki" issue "$d" vmd 'a/../b'
refuses "bad --days" "bad --days" "$pki" issue "$d" vmd x --days soon
refuses "renew of an absent name" "does not exist" "$pki" renew "$d" vmd nobody
refuses "renew with --san" "keeps the certificate's names" "$pki" renew "$d" vmd node-a --san x
refuses "unknown command" "unknown command" "$pki" frob
refuses "openssl missing" "openssl is not installed" env PATH=/nonexistent /bin/bash "$pki" show "$d"
[ ! -e "$d/db" ] && [ ! -e "$d/vmd/x" ] && ok "nothing left behind by refused commands" ||
	fail "a refused command left files"

[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all moat-pki checks passed"
