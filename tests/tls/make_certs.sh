#!/usr/bin/env bash
# Generates the throw-away certificates the TLS tests use, with the openssl CLI only.
#
#   bash tests/tls/make_certs.sh DIR
#
# DIR then holds (PEM, EC P-256 keys, unencrypted):
#   ca.pem / ca.key              the test CA
#   other-ca.pem / other-ca.key  an unrelated CA (the "wrong CA" for either side)
#   server.pem / server.key      signed by ca; SAN DNS:localhost, IP:127.0.0.1
#   expired.pem / expired.key    signed by ca, same SANs, valid only in January 2020
#   wrongname.pem / wrongname.key signed by ca; SAN DNS:redis.invalid only
#   client.pem / client.key      a client certificate signed by ca
#   other-client.pem / other-client.key  a client certificate signed by other-ca
#   node.pem / node.key          signed by ca; SAN DNS:localhost, IP:127.0.0.1, IP:::1; both
#                                serverAuth and clientAuth: a Redis Cluster node presents one
#                                certificate on its client port and, as a client, on the
#                                cluster bus and the replication link
# The tests run on any day: nothing here is close to expiring except expired.pem, which
# expired long ago (OpenSSL 3.0's `req`/`x509` cannot back-date, `openssl ca -startdate` can).
set -euo pipefail
dir=${1:?usage: make_certs.sh DIR}
mkdir -p "$dir"
cd "$dir"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

ca() {  # ca NAME CN
  key "$1.key"
  openssl req -x509 -new -key "$1.key" -sha256 -days 3650 -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$1.pem"
}

leaf() {  # leaf NAME CA SUBJECT-ALT-NAMES EXTENDED-KEY-USAGE
  key "$1.key"
  openssl req -new -key "$1.key" -subj "/CN=$1" -out "$1.csr"
  printf 'basicConstraints=CA:FALSE\nsubjectAltName=%s\nextendedKeyUsage=%s\n' "$3" "$4" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -sha256 -days 3650 \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
}

ca ca "redcount test CA"
ca other-ca "redcount unrelated CA"
leaf server ca "DNS:localhost,IP:127.0.0.1" serverAuth
leaf wrongname ca "DNS:redis.invalid" serverAuth
leaf client ca "DNS:client" clientAuth
leaf other-client other-ca "DNS:client" clientAuth
leaf node ca "DNS:localhost,IP:127.0.0.1,IP:::1" serverAuth,clientAuth

# The expired server certificate: `openssl ca` is the CLI's only way to set both dates.
key expired.key
openssl req -new -key expired.key -subj "/CN=expired" -out expired.csr
printf 'basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' \
  > expired.ext
mkdir -p ca-db
: > ca-db/index.txt
cat > ca-db/ca.cnf <<CNF
[ ca ]
default_ca = test_ca
[ test_ca ]
database = $PWD/ca-db/index.txt
new_certs_dir = $PWD/ca-db
serial = $PWD/ca-db/serial
default_md = sha256
policy = any_name
unique_subject = no
[ any_name ]
commonName = supplied
CNF
openssl ca -batch -config ca-db/ca.cnf -create_serial -cert ca.pem -keyfile ca.key -in expired.csr \
  -startdate 20200101000000Z -enddate 20200201000000Z -extfile expired.ext -notext -out expired.pem \
  2>/dev/null
rm -f ./*.csr ./*.ext
