/*
 * nng_close.h: closing an nng socket without risking a hang. nng 1.5 can
 * block for good in nng_close when a message arrives on one of the
 * socket's pipes while it closes (nng issues 1543 and 1813; fixed in later
 * releases). Survey sockets cannot stop their peers from sending, so they
 * close through this bounded wait instead.
 * Not for: sockets whose peers are known to be quiet (a REQ client with no
 * call in flight closes with plain nng_close).
 */
#ifndef MOAT_NNG_CLOSE_H
#define MOAT_NNG_CLOSE_H

#include <stdbool.h>
#include <stdint.h>

#include <nng/nng.h>

/* moat_nng_close_bounded: closes `sock` from a helper thread and waits at
 * most `wait_ms` for it. Returns true when the close finished; false when
 * it is still stuck (the helper thread and the socket are then abandoned,
 * which at worst keeps one thread blocked until the process exits; the
 * caller logs it) or no thread could be started (the socket is then
 * closed inline). No thread may use `sock` any more. */
bool moat_nng_close_bounded(nng_socket sock, uint32_t wait_ms);

#endif
