/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * pagetier: per-process page-access counting through PTE bits.
 *
 * This header is the one contract between pagetier.ko and user space. Rules:
 * only __u32/__u64 fields, user buffers passed as __u64, explicit padding and
 * reserved fields (must be zero), and a new command number for a new feature
 * instead of a change to an old struct.
 */
#ifndef _UAPI_LINUX_PAGETIER_H
#define _UAPI_LINUX_PAGETIER_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define PAGETIER_VERSION_MAJOR 0
#define PAGETIER_VERSION_MINOR 5
#define PAGETIER_VERSION_PATCH 0

#define PAGETIER_STR_(x) #x
#define PAGETIER_STR(x) PAGETIER_STR_(x)
#define PAGETIER_VERSION_STRING                                          \
	PAGETIER_STR(PAGETIER_VERSION_MAJOR) "." PAGETIER_STR(            \
		PAGETIER_VERSION_MINOR) "." PAGETIER_STR(PAGETIER_VERSION_PATCH)

#define PAGETIER_DEVICE_NAME "pagetier"

/* Access-tracking modes (struct pagetier_attach.mode). */
#define PAGETIER_MODE_FAULT 1 /* hinting faults on sampled PROT_NONE-encoded PTEs */
#define PAGETIER_MODE_ABIT 2  /* test and clear the Accessed bit each scan */

/* Bounds of struct pagetier_attach fields; 0 in a field means the default. */
#define PAGETIER_SCAN_PERIOD_MIN_MS 10
#define PAGETIER_SCAN_PERIOD_MAX_MS 60000
#define PAGETIER_SAMPLE_RATIO_MAX 65536

/* struct pagetier_attach.flags (from 0.5) */
#define PAGETIER_ATTACH_READONLY_FILES (1U << 0) /* also track read-only file mappings */

struct pagetier_version {
	__u32 major;
	__u32 minor;
	__u32 patch;
	__u32 record_size; /* sizeof(struct pagetier_record) */
};

/*
 * A target stays attached until DETACH, its exit, or the close of the last reference to the
 * descriptor that attached it (a profiler that dies leaves nothing marked behind).
 */
struct pagetier_attach {
	__u32 pid;
	__u32 mode;	      /* PAGETIER_MODE_* */
	__u32 scan_period_ms; /* 0: the module's default_scan_period_ms */
	__u32 sample_ratio;   /* fault mode: mark 1 page in N per scan; 0 or 1: all */
	__u64 page_budget;    /* fault mode: at most this many marked per scan; 0: no cap */
	__u32 flags;	      /* from 0.5: PAGETIER_ATTACH_*; other bits: EINVAL */
	__u32 reserved0;      /* must be 0 */
	__u64 reserved[3];    /* must be 0 */
};

struct pagetier_detach {
	__u32 pid;
	__u32 flags; /* must be 0 */
	__u64 reserved[2];
};

/* struct pagetier_record.flags */
#define PAGETIER_REC_PRESENT (1U << 0)	/* mapped at the last scan */
#define PAGETIER_REC_HUGE (1U << 1)	/* a 2 MiB PMD mapping: addr is its start */
#define PAGETIER_REC_ACCESSED (1U << 2) /* accessed since the last reset */
/*
 * From 0.5, the kind of memory (neither flag: anonymous) and whether the page was mapped more
 * than once at the last scan (by other processes too, or shared copy-on-write after a fork):
 * move_pages(2) moves such a page only with MPOL_MF_MOVE_ALL.
 */
#define PAGETIER_REC_SHMEM (1U << 3)  /* shmem/tmpfs: MAP_SHARED|MAP_ANONYMOUS, memfd, /dev/shm */
#define PAGETIER_REC_FILE (1U << 4)   /* page cache of a file on a filesystem */
#define PAGETIER_REC_SHARED (1U << 5) /* mapped more than once at the last scan */

#define PAGETIER_NODE_NONE 0xffffffffU

/*
 * freq (from 0.3): estimated accesses per second of the unit in the last scan period, from the
 * frequency probes that follow each scan (0: not accessed in the last period, or no estimate).
 * With probe_every (sysfs) above its default of 1, a unit accessed in every period since its
 * last probe keeps that probe's estimate, and is probed again in one scan of every probe_every.
 * It took the place of a padding field, so records keep their size: a reader built for 0.2
 * ignores it, and a 0.2 module leaves it 0.
 */
struct pagetier_record {
	__u64 addr;  /* virtual address of the page (or huge mapping) */
	__u32 count; /* accesses counted since the last reset */
	__u32 node;  /* NUMA node at the last scan, or PAGETIER_NODE_NONE */
	__u32 flags; /* PAGETIER_REC_* */
	__u32 freq;  /* estimated accesses per second (saturating), see above */
};

/* struct pagetier_read.flags */
#define PAGETIER_READ_RESET (1U << 0)	      /* zero counts of the records returned */
#define PAGETIER_READ_ACCESSED_ONLY (1U << 1) /* only pages accessed since the last reset */

struct pagetier_read {
	__u32 pid;
	__u32 flags;	  /* PAGETIER_READ_* */
	__u64 buf;	  /* user pointer to struct pagetier_record[buf_len] */
	__u64 buf_len;	  /* capacity of buf, in records */
	__u64 cursor;	  /* in: 0 to start, else the value returned; out: 0 when done */
	__u64 nr_records; /* out: records written */
	__u64 reserved[2];
};

struct pagetier_stats {
	__u32 pid;
	__u32 mode;	      /* out */
	__u64 scans;	      /* scans completed */
	__u64 pages_tracked;  /* pages (huge mappings count as one) seen at the last scan */
	__u64 pages_marked;   /* fault mode: PTEs made inaccessible, total */
	__u64 faults;	      /* fault mode: hinting faults counted */
	__u64 accesses;	      /* accesses counted, total */
	__u64 scan_ns;	      /* time spent scanning, total */
	__u64 probe_ns;	      /* from 0.3: time spent in frequency probes (not their sleeps), total */
	__u64 units_probed;   /* from 0.3: units the frequency probes measured, total */
	__u64 walk_entries;   /* page-table entries the scans examined, total (from 0.3) */
	__u64 scan_resumes;   /* periods that stopped at the scan budget, the scan resuming
			       * in the next period (from 0.3)
			       */
	__u64 regions_tracked; /* from 0.4: 2 MiB regions with present pages at the last pass */
	__u64 regions_idle;    /* from 0.4: regions passes carried over without reading their
				* page table (its upper-level Accessed bit was clear), total
				*/
	__u64 pages_shmem;     /* from 0.5: of pages_tracked, shmem units (0.4: reserved, 0) */
	__u64 pages_file;      /* from 0.5: of pages_tracked, file-backed units (0.4: 0) */
};

/*
 * Region records (from 0.4): one per 2 MiB of address space (aligned) that holds present pages
 * of the target, whether mapped by one huge PMD or by 4 KiB PTEs. A pass tests and clears the
 * Accessed bit of the upper-level entries (PUD, PMD) and reads a page table only where that bit
 * was set: a region whose PMD was not used since the last pass is carried over as it was
 * (PAGETIER_REGION_IDLE, idle_passes > 0), its pages counted as not accessed. count, freq and
 * nr_accessed add up the region's per-page records (PAGETIER_IOC_READ_PAGES gives those).
 */
#define PAGETIER_REGION_SHIFT 21
#define PAGETIER_REGION_SIZE (1ULL << PAGETIER_REGION_SHIFT)

/* struct pagetier_region.flags */
#define PAGETIER_REGION_HUGE (1U << 1)	   /* one 2 MiB (PMD) mapping */
#define PAGETIER_REGION_ACCESSED (1U << 2) /* a page accessed since the last reset */
#define PAGETIER_REGION_MIXED (1U << 3)	   /* pages on more than one node: node is the first's */
#define PAGETIER_REGION_IDLE (1U << 4)	   /* the last pass carried it over (see above) */
/* from 0.5: set when any of its present pages is of that kind (PAGETIER_REC_* above) */
#define PAGETIER_REGION_SHMEM (1U << 5)
#define PAGETIER_REGION_FILE (1U << 6)
#define PAGETIER_REGION_SHARED (1U << 7)

struct pagetier_region {
	__u64 addr;	   /* start, PAGETIER_REGION_SIZE aligned */
	__u32 count;	   /* accesses counted since the last reset, over its pages (saturating) */
	__u32 node;	   /* NUMA node of its pages at the last walk, or PAGETIER_NODE_NONE */
	__u32 flags;	   /* PAGETIER_REGION_* */
	__u32 freq;	   /* estimated accesses per second, summed over its pages (saturating) */
	__u32 nr_present;  /* 4 KiB pages present at the last walk (512 for a huge mapping) */
	__u32 nr_accessed; /* of them, pages accessed since the last reset */
	__u32 idle_passes; /* passes since its page table was last read (0: in the last one) */
	__u32 reserved;
};

/*
 * PAGETIER_IOC_READ_REGIONS (struct pagetier_region records) and PAGETIER_IOC_READ_PAGES
 * (struct pagetier_record records, the drill-down into regions) over [start, end); start and
 * end both 0: the whole address space. Flags and cursor as struct pagetier_read.
 */
struct pagetier_read_range {
	__u32 pid;
	__u32 flags;	  /* PAGETIER_READ_* */
	__u64 buf;	  /* user pointer to buf_len records */
	__u64 buf_len;	  /* capacity of buf, in records */
	__u64 cursor;	  /* in: 0 to start, else the value returned; out: 0 when done */
	__u64 nr_records; /* out: records written */
	__u64 start;	  /* first address (rounded down to a page, or a region for regions) */
	__u64 end;	  /* end address, exclusive; 0 with start 0: no limit */
	__u64 reserved[2];
};

/*
 * Make pages accessible again before they are moved: a page the fault mode left PROT_NONE
 * cannot be moved by move_pages(2) on some kernels (6.1's follow_page skips such entries).
 */
struct pagetier_unmark {
	__u32 pid;
	__u32 flags;   /* must be 0 */
	__u64 addrs;   /* user pointer to __u64[nr]: addresses inside the pages to unmark */
	__u64 nr;      /* at most PAGETIER_UNMARK_MAX */
	__u64 done;    /* out: mappings made accessible again */
	__u64 reserved[2];
};

#define PAGETIER_UNMARK_MAX (1U << 20)
/*
 * From 0.4 UNMARK also has the next pass read the page tables of the regions holding @addrs
 * (in both modes): call it after a move too, as a region carried over would otherwise report
 * the node its pages had before they moved.
 */

/*
 * 0xBA, sequence numbers 0x00-0x1F: a block free in Documentation/userspace-api/ioctl/
 * ioctl-number.rst (until 0.3, 0xB7, which nsfs's NSIO uses).
 */
#define PAGETIER_IOC_MAGIC 0xBA

#define PAGETIER_IOC_VERSION _IOR(PAGETIER_IOC_MAGIC, 0, struct pagetier_version)
#define PAGETIER_IOC_ATTACH _IOW(PAGETIER_IOC_MAGIC, 1, struct pagetier_attach)
#define PAGETIER_IOC_DETACH _IOW(PAGETIER_IOC_MAGIC, 2, struct pagetier_detach)
#define PAGETIER_IOC_READ _IOWR(PAGETIER_IOC_MAGIC, 3, struct pagetier_read)
#define PAGETIER_IOC_STATS _IOWR(PAGETIER_IOC_MAGIC, 4, struct pagetier_stats)
#define PAGETIER_IOC_UNMARK _IOWR(PAGETIER_IOC_MAGIC, 5, struct pagetier_unmark)
#define PAGETIER_IOC_READ_REGIONS _IOWR(PAGETIER_IOC_MAGIC, 6, struct pagetier_read_range)
#define PAGETIER_IOC_READ_PAGES _IOWR(PAGETIER_IOC_MAGIC, 7, struct pagetier_read_range)

#endif /* _UAPI_LINUX_PAGETIER_H */
