/*
 * info.c: the GuestInfo answer: uptime, memory, the root filesystem's
 * space, load, kernel, CPUs and processes, from /proc where it has the
 * better number and sysinfo(2) where /proc is missing. Not for: anything
 * that changes the guest.
 */
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "moat/status.h"

/* info_meminfo: MemTotal and MemAvailable from /proc/meminfo, in KiB.
 * Returns 0 when both were found. */
static int
info_meminfo(uint64_t *total, uint64_t *avail)
{
	char line[256];
	int found = 0;
	FILE *f;

	if ((f = fopen("/proc/meminfo", "re")) == NULL)
		return -1;
	while (fgets(line, sizeof(line), f) != NULL) {
		unsigned long long v;

		if (sscanf(line, "MemTotal: %llu kB", &v) == 1) {
			*total = v;
			found |= 1;
		} else if (sscanf(line, "MemAvailable: %llu kB", &v) == 1) {
			*avail = v;
			found |= 2;
		}
	}
	fclose(f);
	return found == 3 ? 0 : -1;
}

/* info_processes: processes (not threads) now, from /proc; -1 without
 * /proc. */
static long
info_processes(void)
{
	struct dirent *de;
	long n = 0;
	DIR *d;

	if ((d = opendir("/proc")) == NULL)
		return -1;
	while ((de = readdir(d)) != NULL)
		if (isdigit((unsigned char)de->d_name[0]))
			n++;
	closedir(d);
	return n;
}

int
agent_info(struct agent *a, const Moat__V1__GuestRequest *req, char **why)
{
	Moat__V1__GuestMessage m = MOAT__V1__GUEST_MESSAGE__INIT;
	Moat__V1__GuestInfo gi = MOAT__V1__GUEST_INFO__INIT;
	char kernel[3 * sizeof(((struct utsname *)0)->release) + 4];
	struct statvfs vfs;
	struct utsname u;
	struct sysinfo si;
	struct timespec ts;
	long procs, ncpu;
	int have_si;

	have_si = sysinfo(&si) == 0;
	if (clock_gettime(CLOCK_BOOTTIME, &ts) == 0)
		gi.uptime_ms = (uint64_t)ts.tv_sec * 1000 +
		    (uint64_t)ts.tv_nsec / 1000000;
	if (info_meminfo(&gi.mem_total_kib, &gi.mem_available_kib) != 0 &&
	    have_si) {
		gi.mem_total_kib = (uint64_t)si.totalram * si.mem_unit / 1024;
		gi.mem_available_kib =
		    (uint64_t)si.freeram * si.mem_unit / 1024;
	}
	if (fstatvfs(a->root_fd, &vfs) == 0) {
		gi.disk_total_kib =
		    (uint64_t)vfs.f_blocks * vfs.f_frsize / 1024;
		gi.disk_free_kib =
		    (uint64_t)vfs.f_bavail * vfs.f_frsize / 1024;
	}
	if (have_si) {
		gi.load1 = si.loads[0] / (double)(1 << SI_LOAD_SHIFT);
		gi.load5 = si.loads[1] / (double)(1 << SI_LOAD_SHIFT);
		gi.load15 = si.loads[2] / (double)(1 << SI_LOAD_SHIFT);
	}
	kernel[0] = '\0';
	if (uname(&u) == 0)
		snprintf(kernel, sizeof(kernel), "%s %s %s", u.sysname,
		    u.release, u.machine);
	gi.kernel = kernel;
	gi.agent_version = (char *)MOAT_VERSION;
	if ((ncpu = sysconf(_SC_NPROCESSORS_ONLN)) > 0)
		gi.ncpu = (uint32_t)ncpu;
	if ((procs = info_processes()) < 0 && have_si)
		procs = si.procs;
	gi.processes = procs > 0 ? (uint32_t)procs : 0;
	m.id = req->id;
	m.body_case = MOAT__V1__GUEST_MESSAGE__BODY_INFO;
	m.info = &gi;
	(void)agent_send(a, &m);
	return MOAT_OK;
}
