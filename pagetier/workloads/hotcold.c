// SPDX-License-Identifier: GPL-2.0
/*
 * pagetier's built-in workload: a buffer with a hot part touched constantly and a cold part
 * touched once. It reports, once a tick (a second, or --tick-ms), the fraction of its accesses
 * that the fast node served, and checksums every page when it ends.
 *
 * Each tick carries two fractions: "fast_fraction", the share of the hot part's pages on the
 * fast node at the tick, and "access_fast_fraction", the share of the accesses made since the
 * last tick that went to pages on the fast node (each page weighted by its own access counter,
 * word 0, at the node it was on at the tick). Both count only the pages whose node the query
 * could tell: on 6.1, move_pages answers -EFAULT for a page that carries the PROT_NONE hinting
 * mark (its follow_page honours NUMA hinting), so a page marked by a profiler at the moment of
 * the query has no node for that tick. "unknown_pages" says how many; when none is known the
 * tick repeats the last fractions.
 *
 * Usage: hotcold [--size MiB] [--hot MiB] [--hot-offset MiB] [--start-node N] [--fast-node N]
 *                [--duration S] [--phase S] [--phase-on-signal] [--no-thp] [--noise-ppm N]
 *                [--cold-rate HZ] [--tick-ms MS] [--quiet] [--wait] [--no-verify]
 *                [--memory anon|shmem|file:PATH|private:PATH] [--reuse] [--pattern random|sweep]
 *
 * --memory: the kind of memory of the buffer. anon (the default): private anonymous memory.
 * shmem: MAP_SHARED|MAP_ANONYMOUS (shared memory, as a fork would share it). file:PATH: a
 * MAP_SHARED mapping of the file PATH, created (truncated) and filled: page cache, written back
 * by the kernel as the hot part keeps dirtying its pages (each access increments a word); it
 * is synced (msync) before the process exits, so that PATH holds the pattern. A file in a tmpfs
 * (/dev/shm) is shmem. private:PATH: the file PATH, created and filled with the pattern through
 * write(), mapped MAP_PRIVATE: the first write to each page (the fill sets its counter word)
 * makes it a private anonymous copy of the file's page, as a program that maps a data file
 * privately and updates it gets; the file itself keeps the pattern. --reuse (with file:PATH or
 * private:PATH): map PATH as it is, of the same --size, without truncating or filling it
 * (another hotcold filled it): two processes share its pages. The check at the end reads the
 * pattern either way. With --start-node, a shmem or file buffer (and a private one's copies)
 * is first touched under the task's policy (set_mempolicy), as page cache is allocated.
 *
 * Sparse accesses to cold memory, as real programs make them (allocator metadata, garbage
 * collection, a lookup now and then): --noise-ppm N sends N of every million accesses to a
 * random page of the whole buffer instead of the hot part; --cold-rate HZ touches, HZ times a
 * second in all, a random page outside the hot part (paced by the clock, whatever the access
 * rate). Noise raises the pages' access counters (word 0), but fast_fraction and
 * access_fast_fraction still describe the hot part only.
 *
 * --pattern: how the hot part is accessed. random (the default): 8-byte updates at random pages
 * of it, plus a read of a random word of the page. sweep: the hot part in address order, one
 * cache line per page (its counter word and the next), wrapping at its end, as a program
 * streaming through an array touches it; noise applies either way.
 *
 * --phase S: every S seconds the hot part moves to the next window of its size (after the last
 * whole window, back to the first). --phase-on-signal: the moves start at SIGUSR2 (the first S
 * seconds after it), so one process can serve a still hot set, then a moving one.
 *
 * --no-verify: each page is touched once (one word) instead of filled with a pattern, and not
 * checked at the end (pages_checked 0): a start many times faster for footprints of several GiB
 * under emulation, where the fill is most of the start-up.
 *
 * --tick-ms MS: a tick every MS milliseconds instead of every second (a finer look at how fast
 * the hot part reaches the fast node; each tick queries the hot part's nodes with move_pages).
 *
 * --wait: after the ready line, wait for SIGUSR1 before the first access (the clock starts then),
 * so that whatever manages placement can be set up against the touched memory first.
 *
 * Prints one JSON object per line: first {"event":"ready",...} with the buffer and the hot
 * range, then {"event":"tick",...} each tick, then {"event":"done",...}. Exits 0 when every
 * page checks out, 3 when a page is corrupted, 2 on bad arguments.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL
#define WORDS (PAGE / sizeof(uint64_t))

static volatile sig_atomic_t stop, phase_go;
static void on_signal(int sig) { (void)sig; stop = 1; }
static void on_usr2(int sig) { (void)sig; phase_go = 1; }

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The value word k of page i holds (word 0 is the page's access counter). */
static inline uint64_t pattern(uint64_t i, uint64_t k)
{
	uint64_t x = (i << 20) ^ k ^ 0x9e3779b97f4a7c15ULL;
	x ^= x >> 31; x *= 0xbf58476d1ce4e5b9ULL; x ^= x >> 27;
	return x;
}

static void usage(void)
{
	fprintf(stderr, "usage: hotcold [--size MiB] [--hot MiB] [--hot-offset MiB] [--start-node N]\n"
			"               [--fast-node N] [--duration S] [--phase S] [--phase-on-signal]\n"
			"               [--no-thp] [--noise-ppm N] [--cold-rate HZ] [--tick-ms MS]\n"
			"               [--quiet] [--wait] [--no-verify]\n"
			"               [--memory anon|shmem|file:PATH|private:PATH] [--reuse]\n"
			"               [--pattern random|sweep]\n");
	exit(2);
}

static long arg_long(const char *opt, const char *v, long lo, long hi)
{
	char *end;
	long x;
	if (!v) usage();
	errno = 0;
	x = strtol(v, &end, 10);
	if (errno || *end || x < lo || x > hi) {
		fprintf(stderr, "hotcold: %s must be an integer in [%ld, %ld], got '%s'\n", opt, lo, hi, v);
		exit(2);
	}
	return x;
}

/*
 * Fraction of pages [first, first+n) on fast_node, by a move_pages query; with ``seen`` (the
 * pages' access counters at the last tick), also the fraction of the accesses since then that
 * went to pages on fast_node (*weighted), and ``seen`` is brought up to date. Pages whose node
 * the query cannot tell (a negative status) are left out of both and counted in *unknown;
 * with none known, *frac and *weighted keep their values. Returns -1 when the query fails.
 */
static int fraction_on(char *buf, size_t first, size_t n, int fast_node, int *status, void **pages,
		       uint64_t *seen, double *frac, double *weighted, size_t *unknown)
{
	size_t i, on = 0, known = 0;
	uint64_t acc_on = 0, acc_all = 0;
	for (i = 0; i < n; i++)
		pages[i] = buf + (first + i) * PAGE;
	if (move_pages(0, n, pages, NULL, status, 0) != 0)
		return -1;
	for (i = 0; i < n; i++) {
		uint64_t c = *(volatile uint64_t *)pages[i], d = c - seen[i];
		seen[i] = c;
		if (status[i] < 0)
			continue;
		known++;
		on += status[i] == fast_node;
		acc_all += d;
		acc_on += status[i] == fast_node ? d : 0;
	}
	*unknown = n - known;
	if (known) {
		*frac = (double)on / known;
		*weighted = acc_all ? (double)acc_on / acc_all : 0;
	}
	return 0;
}

/* The access counters of pages [first, first+n), as the starting point of a tick. */
static void counters(char *buf, size_t first, size_t n, uint64_t *seen)
{
	for (size_t i = 0; i < n; i++)
		seen[i] = *(volatile uint64_t *)(buf + (first + i) * PAGE);
}

int main(int argc, char **argv)
{
	long size_mb = 256, hot_mb = 32, hot_off_mb = 0, start_node = -1, fast_node = 0;
	long duration = 30, phase = 0, thp = 1, quiet = 0, wait = 0, noise_ppm = 0, cold_rate = 0;
	long tick_ms = 1000, phase_on_signal = 0, verify = 1, reuse = 0, sweep = 0;
	const char *memory = "anon", *path = NULL;
	int i, fd = -1, priv = 0;
	for (i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--size")) size_mb = arg_long(a, v, 1, 1 << 20), i++;
		else if (!strcmp(a, "--hot")) hot_mb = arg_long(a, v, 1, 1 << 20), i++;
		else if (!strcmp(a, "--hot-offset")) hot_off_mb = arg_long(a, v, 0, 1 << 20), i++;
		else if (!strcmp(a, "--start-node")) start_node = arg_long(a, v, 0, 1023), i++;
		else if (!strcmp(a, "--fast-node")) fast_node = arg_long(a, v, 0, 1023), i++;
		else if (!strcmp(a, "--duration")) duration = arg_long(a, v, 0, 1L << 30), i++;
		else if (!strcmp(a, "--phase")) phase = arg_long(a, v, 0, 1L << 30), i++;
		else if (!strcmp(a, "--no-thp")) thp = 0;
		else if (!strcmp(a, "--noise-ppm")) noise_ppm = arg_long(a, v, 0, 1000000), i++;
		else if (!strcmp(a, "--cold-rate")) cold_rate = arg_long(a, v, 0, 10000000), i++;
		else if (!strcmp(a, "--tick-ms")) tick_ms = arg_long(a, v, 10, 60000), i++;
		else if (!strcmp(a, "--quiet")) quiet = 1;
		else if (!strcmp(a, "--wait")) wait = 1;
		else if (!strcmp(a, "--phase-on-signal")) phase_on_signal = 1;
		else if (!strcmp(a, "--no-verify")) verify = 0;
		else if (!strcmp(a, "--reuse")) reuse = 1;
		else if (!strcmp(a, "--memory") && v) memory = v, i++;
		else if (!strcmp(a, "--pattern") && v && (!strcmp(v, "random") || !strcmp(v, "sweep")))
			sweep = !strcmp(v, "sweep"), i++;
		else usage();
	}
	if (!strncmp(memory, "file:", 5) && memory[5])
		path = memory + 5;
	else if (!strncmp(memory, "private:", 8) && memory[8])
		path = memory + 8, priv = 1;
	else if (strcmp(memory, "anon") && strcmp(memory, "shmem")) {
		fprintf(stderr, "hotcold: --memory must be anon, shmem, file:PATH or private:PATH, "
			"got '%s'\n", memory);
		return 2;
	}
	if (reuse && !path) {
		fprintf(stderr, "hotcold: --reuse needs --memory file:PATH or private:PATH\n");
		return 2;
	}
	if (hot_mb + hot_off_mb > size_mb) {
		fprintf(stderr, "hotcold: --hot + --hot-offset (%ld MiB) exceeds --size (%ld MiB)\n",
			hot_mb + hot_off_mb, size_mb);
		return 2;
	}
	if (start_node >= 0 && (numa_available() < 0 || start_node > numa_max_node())) {
		fprintf(stderr, "hotcold: --start-node %ld: no such NUMA node\n", start_node);
		return 2;
	}
	size_t npages = (size_t)size_mb * 256, hot_pages = (size_t)hot_mb * 256;
	size_t hot_first = (size_t)hot_off_mb * 256;
	size_t len = npages * PAGE;
	if (path) {
		fd = open(path, O_RDWR | (reuse ? 0 : O_CREAT | O_TRUNC), 0644);
		if (fd < 0) { fprintf(stderr, "hotcold: %s: %s\n", path, strerror(errno)); return 1; }
		if (!reuse && ftruncate(fd, len)) { perror("hotcold: ftruncate"); return 1; }
		struct stat stb;
		if (reuse && (fstat(fd, &stb) || (size_t)stb.st_size < len)) {
			fprintf(stderr, "hotcold: %s: smaller than --size\n", path);
			return 2;
		}
	}
	/* 2 MiB aligned so THP can back it; shmem and file buffers are mapped over a reservation */
	int anon = !strcmp(memory, "anon");
	char *raw = mmap(NULL, len + (2UL << 20), anon ? PROT_READ | PROT_WRITE : PROT_NONE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (raw == MAP_FAILED) { perror("hotcold: mmap"); return 1; }
	char *buf = (char *)(((uintptr_t)raw + (2UL << 20) - 1) & ~((2UL << 20) - 1));
	if (!anon && mmap(buf, len, PROT_READ | PROT_WRITE, MAP_FIXED |
			  (priv ? MAP_PRIVATE : MAP_SHARED) | (path ? 0 : MAP_ANONYMOUS), fd,
			  0) == MAP_FAILED) {
		perror("hotcold: mmap");
		return 1;
	}
	madvise(buf, len, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
	unsigned long mask = start_node >= 0 ? 1UL << start_node : 0;
	/* first touch on start_node, then default policy so others may move the pages; page
	 * cache (and shmem) is allocated under the task's policy, anonymous memory the VMA's */
	if (start_node >= 0 && !anon && set_mempolicy(MPOL_BIND, &mask, sizeof(mask) * 8)) {
		perror("hotcold: set_mempolicy");
		return 1;
	}
	if (start_node >= 0 && anon && mbind(buf, len, MPOL_BIND, &mask, sizeof(mask) * 8, 0)) {
		perror("hotcold: mbind");
		return 1;
	}
	for (size_t p = 0; priv && !reuse && p < npages; p++) {
		/* the file gets the pattern; the mapping's pages become copies of it below */
		uint64_t page[WORDS];
		page[0] = 0;
		for (size_t k = 1; k < WORDS; k++)
			page[k] = pattern(p, k);
		if (pwrite(fd, page, PAGE, p * PAGE) != (ssize_t)PAGE) {
			perror("hotcold: pwrite");
			return 1;
		}
	}
	for (size_t p = 0; p < npages; p++) {
		uint64_t *w = (uint64_t *)(buf + p * PAGE);
		if (reuse && !priv) {  /* another process filled it: bring the page in */
			(void)*(volatile uint64_t *)w;
			continue;
		}
		w[0] = 0;
		if (priv)  /* that write made the page a private copy of the file's */
			continue;
		for (size_t k = 1; verify && k < WORDS; k++)
			w[k] = pattern(p, k);
	}
	if (start_node >= 0 && !anon && set_mempolicy(MPOL_DEFAULT, NULL, 0)) {
		perror("hotcold: set_mempolicy");
		return 1;
	}
	if (start_node >= 0 && anon && mbind(buf, len, MPOL_DEFAULT, NULL, 0, 0)) {
		perror("hotcold: mbind");
		return 1;
	}

	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	signal(SIGUSR2, on_usr2);
	int *status = calloc(hot_pages, sizeof(int));
	void **pages = calloc(hot_pages, sizeof(void *));
	uint64_t *seen = calloc(hot_pages, sizeof(uint64_t));
	if (!status || !pages || !seen) { perror("hotcold: calloc"); return 1; }
	/* touch the tick's arrays now: after "ready", the process takes no page fault of its own
	 * (tests count its faults to tell whether a profiler left pages inaccessible) */
	memset(status, 0xff, hot_pages * sizeof(int));
	memset(pages, 0xff, hot_pages * sizeof(void *));
	counters(buf, hot_first, hot_pages, seen);
	/* --wait: the signals are blocked before "ready" is printed, so a SIGUSR1 sent as soon as
	 * the line is read waits for sigwait below instead of ending the process */
	sigset_t wait_set;
	sigemptyset(&wait_set);
	sigaddset(&wait_set, SIGUSR1);
	sigaddset(&wait_set, SIGTERM);
	sigaddset(&wait_set, SIGINT);
	if (wait)
		sigprocmask(SIG_BLOCK, &wait_set, NULL);
	printf("{\"event\":\"ready\",\"pid\":%d,\"addr\":%lu,\"size\":%zu,\"hot_addr\":%lu,\"hot_size\":%zu,"
	       "\"page_size\":%lu,\"memory\":\"%s\"}\n", getpid(), (unsigned long)buf, len,
	       (unsigned long)(buf + hot_first * PAGE), hot_pages * PAGE, PAGE,
	       priv ? "private" : path ? "file" : memory);
	fflush(stdout);
	if (wait) {
		int sig = 0;
		if (!stop)
			sigwait(&wait_set, &sig);
		stop = stop || sig != SIGUSR1;
		sigprocmask(SIG_UNBLOCK, &wait_set, NULL);
	}

	double t0 = now(), last = t0, frac_sum = 0, acc_frac_sum = 0, f = 0, wf = 0;
	double cold_due = 0, last_cold = t0; /* cold touches owed by --cold-rate, paced by the clock */
	uint64_t accesses = 0, tick_acc = 0, lcg = 12345, noise_lcg = 67890, sweep_pos = 0;
	/* --noise-ppm: an access goes anywhere when (x % 1000000) < noise_ppm */
	long ticks = 0, cur_phase = 0;
	double phase_t0 = t0; /* the moves count from here (SIGUSR2 with --phase-on-signal) */
	int moving = !phase_on_signal;
	while (!stop && (duration == 0 || now() - t0 < duration)) {
		for (int r = 0; r < 4096; r++) {
			lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
			size_t p = hot_first + (sweep ? sweep_pos++ % hot_pages : (lcg >> 33) % hot_pages);
			if (noise_ppm) {
				noise_lcg = noise_lcg * 6364136223846793005ULL + 1442695040888963407ULL;
				if ((long)((noise_lcg >> 20) % 1000000) < noise_ppm)
					p = (noise_lcg >> 40) % npages;
			}
			volatile uint64_t *w = (uint64_t *)(buf + p * PAGE);
			w[0]++;
			(void)w[sweep ? 1 : 1 + (lcg & (WORDS - 2))];
		}
		accesses += 4096, tick_acc += 4096;
		double t = now();
		if (cold_rate && npages > hot_pages) {
			cold_due += (t - last_cold) * cold_rate, last_cold = t;
			if (cold_due > cold_rate)
				cold_due = cold_rate; /* at most a second's worth after a stall */
			for (; cold_due >= 1; cold_due--) {
				/* a page outside the hot part: the hot part's pages are skipped over */
				noise_lcg = noise_lcg * 6364136223846793005ULL + 1442695040888963407ULL;
				size_t c = (noise_lcg >> 33) % (npages - hot_pages);
				size_t p = c < hot_first ? c : c + hot_pages;
				(*(volatile uint64_t *)(buf + p * PAGE))++;
				accesses++, tick_acc++;
			}
		}
		if (t - last >= tick_ms / 1000.0) {
			size_t unknown = 0;
			double tf = fraction_on(buf, hot_first, hot_pages, fast_node, status, pages, seen,
						&f, &wf, &unknown) == 0 ? f : -1;
			ticks++, frac_sum += tf, acc_frac_sum += wf;
			if (!quiet)
				printf("{\"event\":\"tick\",\"t\":%.2f,\"phase\":%ld,\"hot_addr\":%lu,"
				       "\"accesses_per_s\":%.0f,\"fast_fraction\":%.4f,"
				       "\"access_fast_fraction\":%.4f,\"unknown_pages\":%zu}\n", t - t0,
				       cur_phase, (unsigned long)(buf + hot_first * PAGE), tick_acc / (t - last),
				       tf, wf, unknown);
			fflush(stdout);
			tick_acc = 0, last = t;
			if (!moving && phase_go)
				moving = 1, phase_t0 = t, cur_phase = 0;
			if (moving && phase > 0 && (long)((t - phase_t0) / phase) != cur_phase) {
				/* the hot part moves to the next window */
				cur_phase = (long)((t - phase_t0) / phase);
				/* the next whole window, back to the first past the end: with --size twice
				 * --hot, two regions take turns */
				hot_first += hot_pages;
				if (hot_first + hot_pages > npages)
					hot_first = 0;
				counters(buf, hot_first, hot_pages, seen);
			}
		}
	}
	/* verify every page */
	size_t bad = 0;
	for (size_t p = 0; verify && p < npages; p++) {
		uint64_t *w = (uint64_t *)(buf + p * PAGE);
		for (size_t k = 1; k < WORDS; k++)
			if (w[k] != pattern(p, k)) { bad++; break; }
	}
	/* the file holds what the mapping holds once this returns */
	if (path && msync(buf, len, MS_SYNC)) { perror("hotcold: msync"); return 1; }
	printf("{\"event\":\"done\",\"seconds\":%.2f,\"accesses\":%lu,\"mean_fast_fraction\":%.4f,"
	       "\"mean_access_fast_fraction\":%.4f,\"pages_checked\":%zu,\"pages_corrupt\":%zu}\n",
	       now() - t0, (unsigned long)accesses, ticks ? frac_sum / ticks : 0.0,
	       ticks ? acc_frac_sum / ticks : 0.0, verify ? npages : 0, bad);
	fflush(stdout);
	return bad ? 3 : 0;
}
