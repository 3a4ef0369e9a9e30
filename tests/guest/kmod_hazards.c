// SPDX-License-Identifier: GPL-2.0
/*
 * Targets and a stalled reader for tests/guest/test_kmod_hazards.py and test_kinds_hazards.py
 * (compiled by the tests).
 *
 *   kmod_hazards span BYTES STRIDE N   map BYTES (MAP_NORESERVE, no THP), touch N pages STRIDE
 *                                      apart, print "ready ADDR", then touch them until killed
 *   kmod_hazards exec UNTIL_NS [GEN]   touch 4 MiB, check it, then execve itself (same pid)
 *                                      until CLOCK_MONOTONIC passes UNTIL_NS; print the number
 *                                      of images and exit 0 (1 on corrupt memory)
 *   kmod_hazards stall PID             READ pid's records into a userfaultfd-registered buffer
 *                                      nobody serves: print "stalling", then block until killed
 *   kmod_hazards kinds DIR SECONDS SEED
 *                                      shmem, a shared and a private file mapping under random
 *                                      hazards for SECONDS, checking every page it touches
 *                                      (below: what it does, and its model)
 *   kmod_hazards verify DIR            check the files a kinds run left in DIR against its model
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "linux/pagetier.h"

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static int span(uint64_t bytes, uint64_t stride, uint64_t n)
{
	volatile char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	uint64_t i, round;

	if (p == MAP_FAILED) {
		perror("mmap");
		return 2;
	}
	madvise((void *)p, bytes, MADV_NOHUGEPAGE);
	for (i = 0; i < n; i++)
		p[i * stride] = (char)i;
	printf("ready %lu\n", (unsigned long)p);
	fflush(stdout);
	for (round = 1;; round++) {
		for (i = 0; i < n; i++)
			p[i * stride] += 1;
		usleep(1000);
	}
}

static int exec_loop(char *self, uint64_t until, unsigned long gen)
{
	size_t size = 4 << 20, i;
	char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char until_s[32], gen_s[32];
	uint64_t end = now_ns() + 20 * 1000 * 1000; /* 20 ms in each image */

	if (p == MAP_FAILED) {
		perror("mmap");
		return 2;
	}
	while (now_ns() < end) {
		for (i = 0; i < size; i += 4096)
			p[i] = (char)(i >> 12) ^ (char)gen;
		for (i = 0; i < size; i += 4096) {
			if (p[i] != ((char)(i >> 12) ^ (char)gen)) {
				printf("corrupt at %zu in image %lu\n", i, gen);
				return 1;
			}
		}
	}
	if (now_ns() >= until) {
		printf("%lu images\n", gen + 1);
		return 0;
	}
	snprintf(until_s, sizeof(until_s), "%lu", (unsigned long)until);
	snprintf(gen_s, sizeof(gen_s), "%lu", gen + 1);
	execl("/proc/self/exe", self, "exec", until_s, gen_s, (char *)NULL);
	perror("execl");
	return 2;
}

static int stall(int pid)
{
	size_t size = 1 << 20;
	struct uffdio_api api = { .api = UFFD_API };
	struct uffdio_register reg;
	struct pagetier_read r;
	int dev, uffd;
	void *buf;

	dev = open("/dev/pagetier", O_RDWR);
	uffd = syscall(SYS_userfaultfd, O_CLOEXEC);
	if (dev < 0 || uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) {
		perror("open /dev/pagetier, userfaultfd");
		return 2;
	}
	buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	reg = (struct uffdio_register){
		.range = { .start = (unsigned long)buf, .len = size },
		.mode = UFFDIO_REGISTER_MODE_MISSING,
	};
	if (buf == MAP_FAILED || ioctl(uffd, UFFDIO_REGISTER, &reg)) {
		perror("UFFDIO_REGISTER");
		return 2;
	}
	memset(&r, 0, sizeof(r));
	r.pid = pid;
	r.flags = PAGETIER_READ_RESET;
	r.buf = (unsigned long)buf;
	r.buf_len = size / sizeof(struct pagetier_record);
	printf("stalling\n");
	fflush(stdout);
	if (ioctl(dev, PAGETIER_IOC_READ, &r))
		perror("READ");
	printf("READ returned\n");
	return 0;
}

/*
 * kinds: the memory kinds pagetier.ko 0.5 tracks, under the hazards their pages meet.
 *
 * Three objects of KPAGES pages each: a memfd (shmem), DIR/shared mapped MAP_SHARED and
 * DIR/private mapped MAP_PRIVATE (written, so partly copies of the file's pages). Every step
 * does one hazard drawn with a seeded RNG, then writes or checks a batch of pages:
 *
 *   munmap    a run of mapped pages          remap    an unmapped run mapped again
 *   mremap    a mapped run moved elsewhere   mprotect a run read-only (checked) or PROT_NONE
 *   dontneed  MADV_DONTNEED on a run          remove   MADV_REMOVE (shmem, shared: a hole)
 *   pageout   MADV_PAGEOUT                   cold     MADV_COLD
 *   truncate  ftruncate shrink or grow back  punch    fallocate PUNCH_HOLE (shmem, shared)
 *   pwrite    pwrite() into a file beside its mapping
 *   msync     msync of a shared run          fork     a child checks and writes, then exits
 *
 * The model: per object and page, the version of the file's content (0: zeros, a hole or past
 * a shrink), for the private mapping also the version of its private copy (0: none, the file
 * shows through), and the address the page is mapped at (NULL: unmapped). A page of version V
 * holds word i = pattern(object, page, V, i). Pages past a shared object's size are never
 * touched (SIGBUS). Any mismatch prints the first bad page and exits 1; a SIGSEGV or SIGBUS
 * outside the deliberate PROT_NONE probe does too.
 *
 * SIGUSR1 asks for a pass: every mapped page checked, and the system's hinting faults
 * (/proc/vmstat numa_hint_faults) counted around it, printed as "pass PAGES FAULTS": after a
 * detach no page may fault. At the end every page is checked, the files fsynced, the files'
 * model written to DIR/<name>.model for `verify DIR`, and a summary line printed.
 */
#ifndef MADV_COLD
#define MADV_COLD 20
#endif
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif

#define KPAGE 4096
#define KWORDS (KPAGE / 8)
#define KPAGES 2048		/* pages per object: 8 MiB */
#define KRUN 64			/* the longest run a hazard works on */
#define KBATCH 24		/* pages written or checked per object and step */
#define MODEL_MAGIC 0x70746b696e647331ull /* "ptkinds1" */

enum { SHM, SHARED, PRIV, NOBJ };
static const char *const obj_name[NOBJ] = { "shmem", "shared", "private" };

enum { H_MUNMAP, H_REMAP, H_MREMAP, H_MPROTECT, H_DONTNEED, H_REMOVE, H_PAGEOUT, H_COLD,
       H_TRUNCATE, H_PUNCH, H_PWRITE, H_MSYNC, H_FORK, NHAZ };
static const char *const haz_name[NHAZ] = {
	"munmap", "remap", "mremap", "mprotect", "dontneed", "remove", "pageout", "cold",
	"truncate", "punch", "pwrite", "msync", "fork" };
static const int haz_weight[NHAZ] = { 8, 10, 8, 8, 8, 4, 4, 4, 4, 4, 10, 6, 3 };

struct kobj {
	int fd;
	int size;			/* the file's size in pages (PRIV: always KPAGES) */
	uint32_t ver[KPAGES];		/* the file's content: 0 zeros */
	uint32_t copy[KPAGES];		/* PRIV: the private copy's version, 0 none */
	char *addr[KPAGES];		/* where the page is mapped, NULL nowhere */
};

static struct kobj objs[NOBJ];
static uint64_t rng_state;
static uint32_t gen;			/* the last version handed out */
static uint64_t haz_count[NHAZ], haz_refused[NHAZ];
static uint64_t pages_checked, pages_written;
static volatile sig_atomic_t pass_wanted;
static sigjmp_buf probe_jmp;
static volatile sig_atomic_t probing;

static uint64_t rnd(void)	/* xorshift64* */
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1Dull;
}

static int below(int n)
{
	return (int)(rnd() % (uint64_t)n);
}

static uint64_t mix64(uint64_t x)	/* splitmix64's finaliser */
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

static uint64_t pattern(int o, int p, uint32_t v, int i)
{
	if (!v)
		return 0;
	return mix64(((uint64_t)o << 56) ^ ((uint64_t)p << 32) ^ v) + (uint64_t)i * 0x9E3779B97F4A7C15ull;
}

static void fill(uint64_t *w, int o, int p, uint32_t v)
{
	int i;

	for (i = 0; i < KWORDS; i++)
		w[i] = pattern(o, p, v, i);
}

/* The first word of ``w`` that is not page p's version v, or -1. */
static int mismatch(const volatile uint64_t *w, int o, int p, uint32_t v)
{
	int i;

	for (i = 0; i < KWORDS; i++)
		if (w[i] != pattern(o, p, v, i))
			return i;
	return -1;
}

/* What page p of object o shows through its mapping. */
static uint32_t shown(const struct kobj *k, int o, int p)
{
	return o == PRIV && k->copy[p] ? k->copy[p] : k->ver[p];
}

static int touchable(const struct kobj *k, int p)
{
	return k->addr[p] && p < k->size;
}

static void die_corrupt(const char *who, int o, int p, const volatile uint64_t *w, int i, uint32_t v)
{
	printf("corrupt (%s): %s page %d at %p: word %d is %#llx, want %#llx (version %u, "
	       "file version %u, copy %u)\n", who, obj_name[o], p, (void *)w, i,
	       (unsigned long long)w[i], (unsigned long long)pattern(o, p, v, i), v,
	       objs[o].ver[p], objs[o].copy[p]);
	fflush(stdout);
	_exit(1);
}

static void check_page(const char *who, int o, int p)
{
	const struct kobj *k = &objs[o];
	uint32_t v = shown(k, o, p);
	int i = mismatch((const volatile uint64_t *)k->addr[p], o, p, v);

	if (i >= 0)
		die_corrupt(who, o, p, (const volatile uint64_t *)k->addr[p], i, v);
	pages_checked++;
}

/* Write a new version into page p through its mapping (a private one: its copy). */
static void write_page(int o, int p)
{
	struct kobj *k = &objs[o];
	uint32_t v = ++gen;

	fill((uint64_t *)k->addr[p], o, p, v);
	if (o == PRIV)
		k->copy[p] = v;
	else
		k->ver[p] = v;
	pages_written++;
}

static void on_fault(int sig, siginfo_t *si, void *uc)
{
	char msg[128];
	int n;

	(void)uc;
	if (probing && sig == SIGSEGV)
		siglongjmp(probe_jmp, 1);
	n = snprintf(msg, sizeof(msg), "unexpected %s at %p\n", sig == SIGBUS ? "SIGBUS" : "SIGSEGV",
		     si->si_addr);
	if (write(1, msg, n) < 0)
		_exit(2);
	_exit(1);
}

static void on_usr1(int sig)
{
	(void)sig;
	pass_wanted = 1;
}

static long hint_faults(void)
{
	char key[64];
	long long v;
	FILE *f = fopen("/proc/vmstat", "r");
	long out = -1;

	if (!f)
		return -1;
	while (fscanf(f, "%63s %lld", key, &v) == 2)
		if (!strcmp(key, "numa_hint_faults"))
			out = (long)v;
	fclose(f);
	return out;
}

/* A run [p, p + n) of pages mapped at consecutive addresses (one piece of a mapping, or parts
 * of pieces the kernel placed side by side), starting at a random mapped page. */
static int mapped_run(int o, int *first)
{
	struct kobj *k = &objs[o];
	int p = below(KPAGES), tries, n;

	for (tries = 0; tries < KPAGES && !k->addr[p]; tries++)
		p = (p + 1) % KPAGES;
	if (!k->addr[p])
		return 0;
	for (n = 1; n < 1 + below(KRUN) && p + n < KPAGES; n++)
		if (k->addr[p + n] != k->addr[p] + (size_t)n * KPAGE)
			break;
	*first = p;
	return n;
}

/* The model's addresses of the run of @n pages at @p of @k, now mapped from @base. */
static void place_run(struct kobj *k, int p, int n, char *base)
{
	int i;

	for (i = 0; i < n; i++)
		k->addr[p + i] = base + (size_t)i * KPAGE;
}

/* The same, of pages that can be touched (inside the file). */
static int touchable_run(int o, int *first)
{
	int n = mapped_run(o, first), i;

	for (i = 0; i < n; i++)
		if (*first + i >= objs[o].size)
			break;
	return i;
}

static int hazard_munmap(int o)
{
	struct kobj *k = &objs[o];
	int p, n = mapped_run(o, &p), i;

	if (!n)
		return 0;
	if (munmap(k->addr[p], (size_t)n * KPAGE)) {
		perror("munmap");
		_exit(2);
	}
	for (i = p; i < p + n; i++) {
		k->addr[i] = NULL;
		k->copy[i] = 0;
	}
	return 1;
}

static int hazard_remap(int o)
{
	struct kobj *k = &objs[o];
	int p = below(KPAGES), tries, n;
	char *a;

	for (tries = 0; tries < KPAGES && k->addr[p]; tries++)
		p = (p + 1) % KPAGES;
	if (k->addr[p])
		return 0;
	for (n = 1; n < 1 + below(KRUN) && p + n < KPAGES && !k->addr[p + n]; n++)
		;
	a = mmap(NULL, (size_t)n * KPAGE, PROT_READ | PROT_WRITE,
		 o == PRIV ? MAP_PRIVATE : MAP_SHARED, k->fd, (off_t)p * KPAGE);
	if (a == MAP_FAILED) {
		perror("mmap");
		_exit(2);
	}
	place_run(k, p, n, a);
	return 1;
}

/* A mapped run moved to a new address (MREMAP_FIXED over a reservation). The run may span
 * two mappings the kernel did not merge: mremap refuses that with EFAULT, and nothing moves. */
static int hazard_mremap(int o)
{
	struct kobj *k = &objs[o];
	int p, n = mapped_run(o, &p);
	size_t len = (size_t)n * KPAGE;
	char *to, *got;

	if (!n)
		return 0;
	to = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (to == MAP_FAILED) {
		perror("mmap reservation");
		_exit(2);
	}
	got = mremap(k->addr[p], len, len, MREMAP_MAYMOVE | MREMAP_FIXED, to);
	if (got == MAP_FAILED) {
		if (errno != EFAULT) {
			perror("mremap");
			_exit(2);
		}
		munmap(to, len);
		return -1;
	}
	place_run(k, p, n, got);
	return 1;
}

/* A run made read-only and checked, or PROT_NONE and probed (a read must fault: no mark's
 * restore may make a page the program protected accessible), then read-write again. */
static int hazard_mprotect(int o)
{
	struct kobj *k = &objs[o];
	int p, n = touchable_run(o, &p), i;
	size_t len = (size_t)n * KPAGE;
	int none = below(2);

	if (!n)
		return 0;
	if (mprotect(k->addr[p], len, none ? PROT_NONE : PROT_READ)) {
		perror("mprotect");
		_exit(2);
	}
	if (none) {
		volatile char *q = k->addr[p + below(n)];

		probing = 1;
		if (!sigsetjmp(probe_jmp, 1)) {
			(void)*q;
			probing = 0;
			printf("a page mapped PROT_NONE was readable: %s at %p\n", obj_name[o], (void *)q);
			fflush(stdout);
			_exit(1);
		}
		probing = 0;
	} else {
		for (i = p; i < p + n; i++)
			check_page("read-only", o, i);
	}
	if (mprotect(k->addr[p], len, PROT_READ | PROT_WRITE)) {
		perror("mprotect back");
		_exit(2);
	}
	return 1;
}

static int hazard_madvise(int o, int advice)
{
	struct kobj *k = &objs[o];
	int p, n = touchable_run(o, &p), i;

	if (!n || (advice == MADV_REMOVE && o == PRIV))
		return 0;
	if (madvise(k->addr[p], (size_t)n * KPAGE, advice)) {
		if (advice == MADV_PAGEOUT || advice == MADV_COLD)
			return -1;	/* a kernel without them: nothing changed */
		perror("madvise");
		_exit(2);
	}
	for (i = p; i < p + n; i++) {
		if (advice == MADV_DONTNEED && o == PRIV)
			k->copy[i] = 0;	/* the copies dropped: the file shows again */
		if (advice == MADV_REMOVE)
			k->ver[i] = 0;	/* a hole */
	}
	return 1;
}

static int hazard_truncate(int o)
{
	struct kobj *k = &objs[o];
	int size, p;

	if (o == PRIV)
		return 0;
	size = k->size < KPAGES ? KPAGES : KPAGES / 2 + below(KPAGES / 2);
	if (ftruncate(k->fd, (off_t)size * KPAGE)) {
		perror("ftruncate");
		_exit(2);
	}
	for (p = size; p < KPAGES; p++)
		k->ver[p] = 0;	/* cut (or zeros since the last cut) */
	k->size = size;
	return 1;
}

static int hazard_punch(int o)
{
	struct kobj *k = &objs[o];
	int p = below(k->size), n = 1 + below(KRUN), i;

	if (o == PRIV)
		return 0;
	if (p + n > k->size)
		n = k->size - p;
	if (fallocate(k->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)p * KPAGE,
		      (off_t)n * KPAGE)) {
		perror("fallocate");
		_exit(2);
	}
	for (i = p; i < p + n; i++)
		k->ver[i] = 0;
	return 1;
}

/* New versions written with pwrite() into pages that may be mapped: shared mappings show them
 * at once, a private mapping where it has no copy. It may extend a file cut shorter. */
static int hazard_pwrite(int o)
{
	static uint64_t buf[KRUN * KWORDS];
	struct kobj *k = &objs[o];
	int p = below(KPAGES), n = 1 + below(8), i;

	if (p + n > KPAGES)
		n = KPAGES - p;
	for (i = 0; i < n; i++)
		fill(buf + (size_t)i * KWORDS, o, p + i, gen + 1 + i);
	if (pwrite(k->fd, buf, (size_t)n * KPAGE, (off_t)p * KPAGE) != (ssize_t)n * KPAGE) {
		perror("pwrite");
		_exit(2);
	}
	for (i = 0; i < n; i++)
		k->ver[p + i] = ++gen;
	if (p + n > k->size)
		k->size = p + n;	/* pages between the old end and p read as zeros: ver 0 */
	return 1;
}

static int hazard_msync(int o)
{
	struct kobj *k = &objs[o];
	int p, n = touchable_run(o, &p);

	if (!n || o == PRIV)
		return 0;
	if (msync(k->addr[p], (size_t)n * KPAGE, below(2) ? MS_SYNC : MS_ASYNC | MS_INVALIDATE)) {
		perror("msync");
		_exit(2);
	}
	return 1;
}

/* A child checks pages of every object, writes chosen pages of the shared ones (the parent
 * takes the versions into its model once the child exits 0) and of the private one (its own
 * copies: the parent's pages must not change), then exits. */
static int hazard_fork(void)
{
	int po[NOBJ][KBATCH], status, o, i;
	uint32_t pv[NOBJ][KBATCH];
	pid_t pid;

	for (o = 0; o < NOBJ; o++)
		for (i = 0; i < KBATCH; i++) {
			po[o][i] = below(KPAGES);
			pv[o][i] = ++gen;
		}
	fflush(stdout);
	pid = fork();
	if (pid < 0) {
		perror("fork");
		_exit(2);
	}
	if (pid == 0) {
		for (o = 0; o < NOBJ; o++)
			for (i = 0; i < KBATCH; i++) {
				int p = po[o][i];

				if (!touchable(&objs[o], p))
					continue;
				check_page("child", o, p);
				fill((uint64_t *)objs[o].addr[p], o, p, pv[o][i]);
				if (o == PRIV)
					objs[o].copy[p] = pv[o][i];
				else
					objs[o].ver[p] = pv[o][i];
				check_page("child", o, p);
			}
		_exit(0);
	}
	if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
		printf("fork: the child failed (status %#x)\n", status);
		fflush(stdout);
		_exit(1);
	}
	for (o = 0; o < NOBJ; o++)
		for (i = 0; i < KBATCH; i++)
			if (o != PRIV && touchable(&objs[o], po[o][i]))
				objs[o].ver[po[o][i]] = pv[o][i];
	return 1;
}

static int hazard(int h, int o)
{
	switch (h) {
	case H_MUNMAP: return hazard_munmap(o);
	case H_REMAP: return hazard_remap(o);
	case H_MREMAP: return hazard_mremap(o);
	case H_MPROTECT: return hazard_mprotect(o);
	case H_DONTNEED: return hazard_madvise(o, MADV_DONTNEED);
	case H_REMOVE: return hazard_madvise(o, MADV_REMOVE);
	case H_PAGEOUT: return hazard_madvise(o, MADV_PAGEOUT);
	case H_COLD: return hazard_madvise(o, MADV_COLD);
	case H_TRUNCATE: return hazard_truncate(o);
	case H_PUNCH: return hazard_punch(o);
	case H_PWRITE: return hazard_pwrite(o);
	case H_MSYNC: return hazard_msync(o);
	case H_FORK: return hazard_fork();
	}
	return 0;
}

static int pick_hazard(void)
{
	int total = 0, h, r;

	for (h = 0; h < NHAZ; h++)
		total += haz_weight[h];
	r = below(total);
	for (h = 0; r >= haz_weight[h]; h++)
		r -= haz_weight[h];
	return h;
}

static uint64_t check_all(const char *who)
{
	uint64_t n = 0;
	int o, p;

	for (o = 0; o < NOBJ; o++)
		for (p = 0; p < KPAGES; p++)
			if (touchable(&objs[o], p)) {
				check_page(who, o, p);
				n++;
			}
	return n;
}

/* Every mapped page checked while the system's hinting faults are counted (SIGUSR1). */
static void pass(void)
{
	long f0 = hint_faults(), f1;
	uint64_t n = check_all("pass");

	f1 = hint_faults();
	pass_wanted = 0;
	printf("pass %llu %ld\n", (unsigned long long)n, f1 - f0);
	fflush(stdout);
}

static void kinds_open(const char *dir)
{
	static uint64_t buf[KWORDS];
	char path[4096];
	int o, p;

	for (o = 0; o < NOBJ; o++) {
		struct kobj *k = &objs[o];

		if (o == SHM) {
			k->fd = memfd_create("pagetier-kinds", MFD_CLOEXEC);
		} else {
			snprintf(path, sizeof(path), "%s/%s", dir, obj_name[o]);
			k->fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		}
		if (k->fd < 0) {
			perror(o == SHM ? "memfd_create" : path);
			exit(2);
		}
		for (p = 0; p < KPAGES; p++) {	/* the file written whole, version 1.. */
			k->ver[p] = ++gen;
			fill(buf, o, p, k->ver[p]);
			if (write(k->fd, buf, KPAGE) != KPAGE) {
				perror("write");
				exit(2);
			}
		}
		k->size = KPAGES;
		k->addr[0] = mmap(NULL, (size_t)KPAGES * KPAGE, PROT_READ | PROT_WRITE,
				  o == PRIV ? MAP_PRIVATE : MAP_SHARED, k->fd, 0);
		if (k->addr[0] == MAP_FAILED) {
			perror("mmap");
			exit(2);
		}
		madvise(k->addr[0], (size_t)KPAGES * KPAGE, MADV_NOHUGEPAGE);
		for (p = 1; p < KPAGES; p++)
			k->addr[p] = k->addr[0] + (size_t)p * KPAGE;
	}
}

static int write_model(const char *dir, int o)
{
	char path[4096];
	uint64_t head[2] = { MODEL_MAGIC, (uint64_t)objs[o].size };
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s.model", dir, obj_name[o]);
	f = fopen(path, "w");
	if (!f || fwrite(head, sizeof(head), 1, f) != 1 ||
	    fwrite(objs[o].ver, sizeof(objs[o].ver), 1, f) != 1 || fclose(f)) {
		perror(path);
		return 2;
	}
	return 0;
}

static int kinds_main(const char *dir, double seconds, uint64_t seed)
{
	struct sigaction sa = { .sa_sigaction = on_fault, .sa_flags = SA_SIGINFO | SA_NODEFER };
	struct sigaction su = { .sa_handler = on_usr1, .sa_flags = SA_RESTART };
	uint64_t end, steps = 0, hazards = 0, refused = 0;
	int o, h, i;

	rng_state = seed * 0x9E3779B97F4A7C15ull | 1;
	sigaction(SIGSEGV, &sa, NULL);
	sigaction(SIGBUS, &sa, NULL);
	sigaction(SIGUSR1, &su, NULL);
	kinds_open(dir);
	check_all("start");
	printf("ready shmem %p shared %p private %p\n", (void *)objs[SHM].addr[0],
	       (void *)objs[SHARED].addr[0], (void *)objs[PRIV].addr[0]);
	fflush(stdout);
	end = now_ns() + (uint64_t)(seconds * 1e9);
	while (now_ns() < end) {
		if (pass_wanted)
			pass();
		h = pick_hazard();
		o = below(NOBJ);
		switch (hazard(h, o)) {
		case 1:
			haz_count[h]++;
			hazards++;
			break;
		case -1:
			haz_refused[h]++;
			refused++;
			break;
		}
		for (o = 0; o < NOBJ; o++)
			for (i = 0; i < KBATCH; i++) {
				int p = below(KPAGES);

				if (!touchable(&objs[o], p))
					continue;
				if (below(3))
					check_page("touch", o, p);
				else
					write_page(o, p);
			}
		steps++;
		usleep(200);
	}
	if (pass_wanted)
		pass();
	check_all("end");
	for (o = SHARED; o < NOBJ; o++)
		if (fsync(objs[o].fd) || write_model(dir, o))
			return 2;
	printf("kinds: %llu steps, %llu hazards (", (unsigned long long)steps,
	       (unsigned long long)hazards);
	for (h = 0; h < NHAZ; h++)
		printf("%s%s %llu", h ? ", " : "", haz_name[h], (unsigned long long)haz_count[h]);
	printf("; %llu refused: mremap across mappings %llu, pageout %llu, cold %llu), %llu pages "
	       "checked, %llu written, 0 corrupt\n", (unsigned long long)refused,
	       (unsigned long long)haz_refused[H_MREMAP], (unsigned long long)haz_refused[H_PAGEOUT],
	       (unsigned long long)haz_refused[H_COLD], (unsigned long long)pages_checked,
	       (unsigned long long)pages_written);
	return 0;
}

/* The files a kinds run left in DIR, read back page by page against the model it wrote. */
static int kinds_verify(const char *dir)
{
	static uint64_t buf[KWORDS];
	static uint32_t ver[KPAGES];
	uint64_t head[2], checked = 0, bad = 0;
	char path[4096];
	struct stat st;
	int o, p, fd, i;
	FILE *f;

	for (o = SHARED; o < NOBJ; o++) {
		snprintf(path, sizeof(path), "%s/%s.model", dir, obj_name[o]);
		f = fopen(path, "r");
		if (!f || fread(head, sizeof(head), 1, f) != 1 || head[0] != MODEL_MAGIC ||
		    head[1] > KPAGES || fread(ver, sizeof(ver), 1, f) != 1) {
			printf("%s: missing or not a kinds model\n", path);
			return 2;
		}
		fclose(f);
		snprintf(path, sizeof(path), "%s/%s", dir, obj_name[o]);
		fd = open(path, O_RDONLY);
		if (fd < 0 || fstat(fd, &st)) {
			perror(path);
			return 2;
		}
		if (st.st_size != (off_t)head[1] * KPAGE) {
			printf("%s: %lld bytes, the model says %llu pages\n", path,
			       (long long)st.st_size, (unsigned long long)head[1]);
			return 1;
		}
		for (p = 0; p < (int)head[1]; p++) {
			if (pread(fd, buf, KPAGE, (off_t)p * KPAGE) != KPAGE) {
				perror("pread");
				return 2;
			}
			i = mismatch(buf, o, p, ver[p]);
			if (i >= 0 && !bad++)
				printf("corrupt (file): %s page %d: word %d is %#llx, want %#llx "
				       "(version %u)\n", obj_name[o], p, i, (unsigned long long)buf[i],
				       (unsigned long long)pattern(o, p, ver[p], i), ver[p]);
			checked++;
		}
		close(fd);
	}
	printf("verify: %llu pages checked, %llu corrupt\n", (unsigned long long)checked,
	       (unsigned long long)bad);
	return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[1], "span"))
		return span(strtoull(argv[2], NULL, 0), strtoull(argv[3], NULL, 0),
			    strtoull(argv[4], NULL, 0));
	if (argc >= 3 && !strcmp(argv[1], "exec"))
		return exec_loop(argv[0], strtoull(argv[2], NULL, 0),
				 argc > 3 ? strtoul(argv[3], NULL, 0) : 0);
	if (argc == 3 && !strcmp(argv[1], "stall"))
		return stall(atoi(argv[2]));
	if (argc == 5 && !strcmp(argv[1], "kinds"))
		return kinds_main(argv[2], strtod(argv[3], NULL), strtoull(argv[4], NULL, 0));
	if (argc == 3 && !strcmp(argv[1], "verify"))
		return kinds_verify(argv[2]);
	fprintf(stderr, "usage: see the comment at the top of kmod_hazards.c\n");
	return 2;
}
