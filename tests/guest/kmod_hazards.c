// SPDX-License-Identifier: GPL-2.0
/*
 * Targets and a stalled reader for tests/guest/test_kmod_hazards.py (compiled by the test).
 *
 *   kmod_hazards span BYTES STRIDE N   map BYTES (MAP_NORESERVE, no THP), touch N pages STRIDE
 *                                      apart, print "ready ADDR", then touch them until killed
 *   kmod_hazards exec UNTIL_NS [GEN]   touch 4 MiB, check it, then execve itself (same pid)
 *                                      until CLOCK_MONOTONIC passes UNTIL_NS; print the number
 *                                      of images and exit 0 (1 on corrupt memory)
 *   kmod_hazards stall PID             READ pid's records into a userfaultfd-registered buffer
 *                                      nobody serves: print "stalling", then block until killed
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
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
	fprintf(stderr, "usage: see the comment at the top of kmod_hazards.c\n");
	return 2;
}
