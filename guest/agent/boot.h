/*
 * boot.h: what moat-agent does as PID 1 before it serves the guest link:
 * mount /proc, /sys, /dev, load the kernel modules the initramfs carries,
 * mount the read-only image and the scratch disk, make the overlay, switch
 * root, and find the virtio-serial port. Also the clean power-off.
 * Not for: the guest protocol (the rest of guest/agent).
 *
 * The contract with images/build.sh and moat-vmd:
 * - initramfs: /init is moat-agent (static); kernel modules in
 *   /lib/modules/ with their load order in /etc/moat/modules (one file
 *   name a line; already-loaded or built-in is fine).
 * - kernel command line keys the agent reads from /proc/cmdline:
 *   moat.root=/dev/vda (image, ext4, read-only), moat.scratch=/dev/vdb
 *   (ext4 made by vmd), moat.port=org.moat.agent (virtio-serial port
 *   name), moat.vsock=PORT (Firecracker: listen on AF_VSOCK instead),
 *   moat.test=MODE (test-only misbehaviour, see agent tests).
 * - guest egress (issue 14) is not on the command line (a restored VM
 *   keeps its origin's): vmd turns it on and off by a guest request
 *   (EgressMode, egress.c), on the port named org.moat.egress.
 */
#ifndef MOAT_AGENT_BOOT_H
#define MOAT_AGENT_BOOT_H

#include <stddef.h>
#include <stdint.h>

struct agent_boot {
	int lower_fd;        /* image root dir, -1 when not booted by us */
	int upper_fd;        /* overlay upper dir, -1 likewise */
	char port_path[256]; /* /dev/vportNpM to serve, "" if none */
	uint32_t vsock_port; /* 0 unless moat.vsock= */
	uint64_t boot_ms;    /* guest uptime when boot finished */
	char test_mode[32];  /* moat.test=, "" normally */
};

/* agent_boot_init: does PID 1's setup. Returns 0 with *b filled, or an
 * errno value after writing the reason to the console (the caller then
 * powers off: a guest that cannot boot must not hang). */
int agent_boot_init(struct agent_boot *b);

/* agent_boot_poweroff: syncs and powers the VM off (reboot(2) with
 * RB_POWER_OFF, falling back to RB_AUTOBOOT, which QEMU's -no-reboot
 * turns into an exit). Never returns. */
void agent_boot_poweroff(void) __attribute__((noreturn));

/* agent_boot_find_port: looks once for the virtio-serial port named
 * `name`; fills path with its /dev node. Returns 1 when found. */
int agent_boot_find_port(const char *name, char *path, size_t size);

#endif
