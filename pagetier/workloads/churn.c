// SPDX-License-Identifier: GPL-2.0
/*
 * churn: a target that keeps changing its address space, for pagetier's hardening tests.
 * For SECONDS it maps and unmaps memory (some of it huge-page aligned), grows it with mremap,
 * mprotects it, discards it with MADV_DONTNEED and MADV_FREE, shares it with forked children,
 * and checks that every byte it did not discard still holds what it wrote.
 *
 * Usage: churn SECONDS      Exits 0 when all checks pass, 3 on corruption.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MB (1UL << 20)

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void fill(unsigned char *p, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i += 512)
		p[i] = (unsigned char)(seed + i / 512);
}

static int check(const unsigned char *p, size_t len, unsigned seed, const char *what)
{
	for (size_t i = 0; i < len; i += 512)
		if (p[i] != (unsigned char)(seed + i / 512)) {
			fprintf(stderr, "churn: %s corrupted at +%zu\n", what, i);
			return 1;
		}
	return 0;
}

int main(int argc, char **argv)
{
	double end = now() + (argc > 1 ? atof(argv[1]) : 5);
	unsigned long rounds = 0, bad = 0;
	unsigned seed = 1;

	while (now() < end && !bad) {
		size_t len = (1 + rand() % 8) * 2 * MB;
		unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED) { perror("mmap"); return 1; }
		madvise(p, len, (rounds & 1) ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
		fill(p, len, seed);
		usleep(20000); /* let scans see it */
		bad += check(p, len, seed, "fresh");
		/* grow, possibly moving */
		unsigned char *q = mremap(p, len, 2 * len, MREMAP_MAYMOVE);
		if (q == MAP_FAILED) { perror("mremap"); return 1; }
		bad += check(q, len, seed, "mremapped");
		fill(q + len, len, seed + 7);
		/* read-only for a while, then back */
		mprotect(q, len, PROT_READ);
		usleep(10000);
		bad += check(q, len, seed, "read-only");
		mprotect(q, len, PROT_READ | PROT_WRITE);
		/* discard the first MiB; the rest must stay */
		madvise(q, MB, (rounds & 2) ? MADV_FREE : MADV_DONTNEED);
		if (!(rounds & 2))
			for (size_t i = 0; i < MB; i += 4096)
				if (q[i]) { fprintf(stderr, "churn: DONTNEED page not zero\n"); bad++; break; }
		bad += check(q + MB, len - MB, seed + MB / 512, "after madvise");
		/* a child reads the private copy and writes a shared mapping */
		unsigned char *shared = mmap(NULL, 2 * MB, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (shared == MAP_FAILED) { perror("mmap shared"); return 1; }
		pid_t child = fork();
		if (child == 0) {
			int cbad = check(q + len, len, seed + 7, "child view");
			fill(shared, 2 * MB, seed + 3);
			fill(q + len, len, seed + 9); /* copy-on-write: the parent must not see it */
			_exit(cbad ? 3 : 0);
		}
		int status;
		waitpid(child, &status, 0);
		if (!WIFEXITED(status) || WEXITSTATUS(status)) bad++;
		bad += check(shared, 2 * MB, seed + 3, "shared");
		bad += check(q + len, len, seed + 7, "after child's COW write");
		munmap(shared, 2 * MB);
		munmap(q, 2 * len);
		rounds++, seed++;
	}
	printf("{\"event\":\"done\",\"rounds\":%lu,\"corrupt\":%lu}\n", rounds, bad);
	return bad ? 3 : 0;
}
