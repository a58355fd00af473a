#!/bin/sh
# tls_certs.sh DIR: throwaway certificates for the TLS tests, made with
# the openssl command line (EC P-256, one day): a root CA, intermediates
# "gateway", "vmd", "rogue", "sessiond" and "snapd" (all under the root),
# and leaves:
#   DIR/gw/     CN=gateway (DNS:gateway, IP:127.0.0.1) from the gateway
#               intermediate
#   DIR/node-a/ CN=node-a  (DNS:node-a)   from the vmd intermediate
#   DIR/node-b/ CN=node-b  (DNS:node-b)   from the vmd intermediate
#   DIR/rogue/  CN=node-a  (DNS:node-a)   from the rogue intermediate
#   DIR/vmdgw/  CN=gateway (DNS:gateway)  from the vmd intermediate
#   DIR/sessiond/, DIR/snapd/  CN=sessiond, CN=snapd from their own
# each with cert.pem (leaf then intermediate) and key.pem; the CAs are
# DIR/ca/<name>.crt. Not for: operators
# (deploy/moat-pki).
set -eu
d=$1
mkdir -p "$d/ca"
cd "$d"
cat > ext.cnf <<'EOF'
[ca]
basicConstraints = critical,CA:true,pathlen:0
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[leaf]
basicConstraints = critical,CA:false
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth,clientAuth
subjectAltName = ${ENV::SAN}
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EOF
export SAN=unused
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 \
	-out "$1" 2>/dev/null; }
key ca/root.key
openssl req -x509 -new -key ca/root.key -subj /CN=test-root -days 2 \
	-addext basicConstraints=critical,CA:true \
	-addext keyUsage=critical,keyCertSign,cRLSign \
	-out ca/root.crt 2>/dev/null
for i in gateway vmd rogue sessiond snapd; do
	key ca/$i.key
	openssl req -new -key ca/$i.key -subj /CN=test-$i-ca \
		-out ca/$i.csr 2>/dev/null
	openssl x509 -req -in ca/$i.csr -CA ca/root.crt -CAkey ca/root.key \
		-CAcreateserial -days 2 -extfile ext.cnf -extensions ca \
		-out ca/$i.crt 2>/dev/null
done
leaf() { # dir name intermediate [subjectAltName]
	mkdir -p "$1"
	key "$1/key.pem"
	openssl req -new -key "$1/key.pem" -subj "/CN=$2" \
		-out "$1/req.csr" 2>/dev/null
	SAN=${4:-DNS:$2} openssl x509 -req -in "$1/req.csr" -CA "ca/$3.crt" \
		-CAkey "ca/$3.key" -CAcreateserial -days 2 -extfile ext.cnf \
		-extensions leaf -out "$1/leaf.pem" 2>/dev/null
	cat "$1/leaf.pem" "ca/$3.crt" > "$1/cert.pem"
}
leaf gw gateway gateway DNS:gateway,IP:127.0.0.1
leaf node-a node-a vmd
leaf node-b node-b vmd
leaf rogue node-a rogue
leaf vmdgw gateway vmd
leaf sessiond sessiond sessiond
leaf snapd snapd snapd
