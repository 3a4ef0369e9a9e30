/* SPDX-License-Identifier: GPL-2.0 */
/*
 * pagetier.ko internals: targets, the scan core, and the ops table each mode fills.
 */
#ifndef _PAGETIER_H
#define _PAGETIER_H

#include <linux/atomic.h>
#include <linux/kobject.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/mm.h>
#include <linux/mmu_notifier.h>
#include <linux/pid.h>
#include <linux/rwsem.h>
#include <linux/version.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>

#include "include/uapi/linux/pagetier.h"

/* Kbuild refuses other architectures with a message; this catches builds that bypass it. */
#ifndef CONFIG_X86_64
#error "pagetier.ko supports x86-64 only (see docs/kmod.md)"
#endif

struct pagetier_target;

/**
 * struct pagetier_mode_ops - how one access-tracking mode works.
 * @name:	mode name, for logs and sysfs.
 * @mode:	PAGETIER_MODE_*.
 * @pte:	called by the scan for each present PTE of a tracked VMA, with the page-table lock
 *		held. @sample says whether this PTE is in this scan's sample. May change the PTE.
 *		Return: true if the page was accessed since the previous scan (as far as this mode
 *		can tell at scan time; fault mode counts its accesses in the fault hook instead).
 * @pmd:	the same for a huge PMD mapping.
 * @flush:	true if the scan must flush the TLB for the range it walked.
 * @detach:	called once when a target is detached while its address space is alive, with
 *		mmap_lock held for read: undo every change the mode made to the page tables.
 * @unmark:	undo the mode's changes to the pages holding @addrs (mmap_lock held for read).
 *		Return: how many mappings changed. May be NULL (nothing to undo).
 * @probe_pte:	one step of a frequency probe (probe.c) on a present PTE of a unit accessed in
 *		the last period, page-table lock held. With @test, tell whether the unit was
 *		accessed since the previous step armed it; with @arm, arm it for the next window
 *		(abit: clear the Accessed bit; fault: make it inaccessible). The caller flushes
 *		the TLB after an arming pass. Return: PT_PROBE_HIT and/or PT_PROBE_ARMED (the unit
 *		is armed now). May be NULL: the mode cannot probe.
 * @probe_pmd:	the same for a huge PMD mapping.
 * @period_from_start: whether the scan periods are timed start to start (target.c,
 *		next_scan_delay()); otherwise each waits a whole period after the last one ended.
 */
struct pagetier_mode_ops {
	const char *name;
	u32 mode;
	bool (*pte)(struct pagetier_target *t, struct vm_area_struct *vma, unsigned long addr,
		    pte_t *ptep, bool sample);
	bool (*pmd)(struct pagetier_target *t, struct vm_area_struct *vma, unsigned long addr,
		    pmd_t *pmdp, bool sample);
	bool flush;
	bool protects; /* @pte and @pmd change protections: invalidate secondary MMUs around them */
	bool period_from_start; /* scan_period_ms timed from a period's start, not its end */
	void (*detach)(struct pagetier_target *t);
	unsigned long (*unmark)(struct pagetier_target *t, const u64 *addrs, unsigned long nr);
	unsigned int (*probe_pte)(struct pagetier_target *t, struct vm_area_struct *vma,
				  unsigned long addr, pte_t *ptep, bool test, bool arm);
	unsigned int (*probe_pmd)(struct pagetier_target *t, struct vm_area_struct *vma,
				  unsigned long addr, pmd_t *pmdp, bool test, bool arm);
};

/* results of the probe ops */
#define PT_PROBE_HIT 1U
#define PT_PROBE_ARMED 2U

/*
 * A tracked page's entry in the target's xarray (index: address >> PAGE_SHIFT), a value entry:
 * bits 0-31 access count, 32-41 node + 1 (0: unknown), 42 huge mapping, 43-50 scan generation,
 * 51 seen (accessed since the previous scan, as far as faults or probe hits tell; read and
 * cleared by the scan), 52-55 the last frequency probe's result (0: none, else 1 + windows hit),
 * 56-57 the kind of memory (PT_KIND_*), 58 mapped more than once at the last scan.
 * XA_MARK_0 marks entries accessed since the last reset.
 */
#define PT_COUNT_MASK 0xffffffffUL
#define PT_NODE_SHIFT 32
#define PT_NODE_MASK (0x3ffUL << PT_NODE_SHIFT)
#define PT_HUGE (1UL << 42)
#define PT_GEN_SHIFT 43
#define PT_GEN_MASK (0xffUL << PT_GEN_SHIFT)
#define PT_ACCESSED XA_MARK_0
#define PT_SEEN (1UL << 51)
#define PT_PROBE_SHIFT 52
#define PT_PROBE_MASK (0xfUL << PT_PROBE_SHIFT)
#define PT_PROBE_MAX_WINDOWS 6
#define PT_KIND_SHIFT 56
#define PT_KIND_MASK (3UL << PT_KIND_SHIFT)
#define PT_SHARED (1UL << 58)

/* kinds of memory (pagetier_page_kind()) */
#define PT_KIND_ANON 0
#define PT_KIND_SHMEM 1 /* shmem/tmpfs: MAP_SHARED|MAP_ANONYMOUS, memfd, /dev/shm */
#define PT_KIND_FILE 2	/* page cache of a file on a filesystem */

/* The record flags a page entry's kind bits give (PAGETIER_REC_SHMEM, _FILE, _SHARED). */
static inline u32 pagetier_entry_kind_flags(unsigned long v)
{
	unsigned long kind = (v & PT_KIND_MASK) >> PT_KIND_SHIFT;

	return (kind == PT_KIND_SHMEM ? PAGETIER_REC_SHMEM : 0) |
	       (kind == PT_KIND_FILE ? PAGETIER_REC_FILE : 0) |
	       ((v & PT_SHARED) ? PAGETIER_REC_SHARED : 0);
}

/*
 * A region's entry in the target's region table (index: address >> PMD_SHIFT, one per 2 MiB
 * holding present pages), a value entry: bits 0-9 present pages (0-512), 10-19 node + 1 of its
 * first page (0: unknown), 20 pages on more than one node, 21 one huge mapping, 22 carried over
 * by the pass that stamped it (idle: its upper-level Accessed bit was clear), 23 read its page
 * table in the next pass whatever its bits say, 24-31 the scan generation of the pass that
 * last saw it, 32-58 the number (t->scans, modulo 2^27) of the pass that last read its page
 * table, 59 that read found PT_USED_PAGES or more pages accessed (abit's window reads it again),
 * 60-62 whether any of its pages is shmem, file-backed, mapped more than once.
 */
#define PR_PRESENT_MASK 0x3ffUL
#define PR_NODE_SHIFT 10
#define PR_NODE_MASK (0x3ffUL << PR_NODE_SHIFT)
#define PR_MIXED (1UL << 20)
#define PR_HUGE (1UL << 21)
#define PR_IDLE (1UL << 22)
#define PR_REWALK (1UL << 23)
#define PR_GEN_SHIFT 24
#define PR_GEN_MASK (0xffUL << PR_GEN_SHIFT)
#define PR_WALKED_SHIFT 32
#define PR_WALKED_BITS 27
#define PR_WALKED_MASK (((1UL << PR_WALKED_BITS) - 1) << PR_WALKED_SHIFT)
#define PR_SHMEM (1UL << 60)
#define PR_FILE (1UL << 61)
#define PR_SHARED (1UL << 62)
#define PR_KINDS (PR_SHMEM | PR_FILE | PR_SHARED)
#define PR_USED (1UL << 59)
/*
 * A mark on a region's entry: a pass read its page table in parts (a VMA boundary inside its
 * 2 MiB), so the pages of its entries that this pass did not store are gone (their generation
 * is older) and are forgotten at its end. A table read whole drops its gone pages as it is read.
 */
#define PR_BY_GEN XA_MARK_1
/*
 * Pages accessed since its table's last read that make a region "in use" (PR_USED): a hot
 * region has most of its 512, a region the odd access touched has a few.
 */
#define PT_USED_PAGES 16
#define PT_REGION_PAGES (PMD_SIZE >> PAGE_SHIFT)

/**
 * struct pagetier_target - one tracked process.
 *
 * Lifetime: counted by @ref. The list of targets holds one reference from ATTACH until the
 * target is unlinked (DETACH, the close of @owner, the target's exit, rmmod). An ioctl looks a
 * target up under targets_lock, takes a reference, drops the lock and only then works on it, so
 * no ioctl holds the global lock across user memory or a target's mmap_lock. Whoever unlinks a
 * target waits for an RCU grace period (the fault hook finds targets under RCU) and stops its
 * scan work before dropping the list's reference; the last reference frees the counts, drops
 * @mm and frees the target.
 *
 * Locking, field by field:
 * @node:	on pagetier_targets: changed under targets_lock, read under it or under RCU.
 * @linked:	whether @node is on the list (whoever clears it owns the list's reference);
 *		targets_lock.
 * @ref:	the reference count.
 * @pid, @owner, @spid, @ops, @scan_period_ms, @sample_ratio, @page_budget, @attach_flags:
 *		set before the target is published, constant afterwards.
 * @mm:		the address space tracked, mmgrab()bed. Written only by the scan work when the
 *		target calls execve, under @mm_lock held for write. Any other user of the mm holds
 *		@mm_lock for read as long as it uses it (UNMARK, detach's restore), so the mm it
 *		locks, walks, unlocks and puts is one; the fault hook and ATTACH's duplicate check
 *		only compare the pointer, under RCU, with READ_ONCE.
 * @mm_lock:	see @mm; taken before the mm's mmap_lock, never inside it.
 * @exec_gen:	bumped with each change of @mm (under @mm_lock held for write): a READ that
 *		copied records out resets their counts only if it is unchanged.
 * @pages:	the counts (see PT_*), under their own xa_lock. Emptied when @mm changes.
 * @regions:	the region table (see PR_*), under its own xa_lock, never nested with @pages'
 *		(both xarrays' locks share one lock class). Written by the scan work and UNMARK,
 *		read by READ_REGIONS; emptied when @mm changes.
 * @work:	the scan; queued by ATTACH and by itself, cancelled by whoever unlinks the target.
 * Scan state (@gen, @ratio_now, @marked_now, @tracked_now, @shmem_now, @file_now, @cursor,
 *		@pass_started, @walked_now, @walked_last, @regions_now, @memo_*):
 *		the scan work's own; no one else touches them.
 * Statistics (@scans, @pages_tracked, @pages_shmem, @pages_file, @pages_marked, @scan_ns,
 *		@walk_entries, @scan_resumes):
 *		written by the scan work only, read locklessly with READ_ONCE; @faults and
 *		@accesses are atomic.
 */
struct pagetier_target {
	struct list_head node;
	bool linked;
	struct kref ref;
	pid_t pid;
	const struct file *owner; /* the descriptor that attached it; closing it detaches */
	struct pid *spid;
	const struct pagetier_mode_ops *ops;
	u32 scan_period_ms;
	u32 sample_ratio;
	u64 page_budget;
	u32 attach_flags; /* PAGETIER_ATTACH_* */
	struct mm_struct *mm;
	struct rw_semaphore mm_lock;
	unsigned long exec_gen;
	struct xarray pages;
	struct xarray regions;
	struct delayed_work work;
	/* the scan's own */
	u8 gen; /* scan generation: a pass stamps every entry it sees */
	u32 ratio_now;
	u64 marked_now;
	u64 tracked_now;
	u64 shmem_now, file_now; /* of tracked_now, shmem and file-backed units */
	unsigned long cursor; /* where a pass cut short by the budget resumes */
	bool pass_started;
	u64 walked_now, walked_last; /* pages whose page table the pass read (this one, the last) */
	u64 regions_now;
	/* the upper-level entry whose Accessed bit the pass tested last (index + 1), and the bit */
	unsigned long memo_pud, memo_pmd;
	bool memo_pud_young, memo_pmd_young;
	/* statistics */
	u64 scans; /* complete passes */
	u64 pages_tracked;
	u64 pages_shmem, pages_file; /* of pages_tracked */
	u64 pages_marked;
	atomic64_t faults;
	atomic64_t accesses;
	u64 scan_ns;
	/*
	 * Frequency probes (probe.c), written by the scan work only; the READ path reads them
	 * without a lock (a torn window length only skews one estimate).
	 */
	u8 probe_k;				 /* windows of the last complete probe */
	u32 probe_win_us[PT_PROBE_MAX_WINDOWS]; /* their measured lengths, ascending */
	u64 probe_ns;				 /* time spent probing (not sleeping), total */
	u64 units_probed;			 /* units probed, total */
	bool stopping; /* set before the scan work is cancelled: probes end at the next window */
	u64 walk_entries; /* page-table entries examined by scans */
	u64 scan_resumes; /* periods that ended at the budget, the pass resuming later */
	u64 regions_tracked; /* regions at the end of the last pass */
	u64 regions_idle;    /* regions carried over without reading their page table, total */
};

/* pagetier_main.c: the device and its knobs */
extern unsigned int pagetier_scan_budget; /* sysfs scan_budget: page-table entries per period */
extern unsigned int pagetier_upper_bits;  /* sysfs upper_bits: skip tables whose bit is clear */
extern unsigned int pagetier_pud_refresh; /* sysfs pud_refresh: passes between PUD re-reads */
extern unsigned int pagetier_upper_window_ms; /* sysfs upper_window_ms: the upper bits' window */
extern unsigned int pagetier_upper_window_max; /* sysfs upper_window_max: windows a period may wait */
extern atomic64_t pagetier_window_waits; /* sysfs window_waits: windows waited again, all targets */

/* target.c: the targets, their lifetime and scan work; helpers for the modes */
extern struct list_head pagetier_targets;
extern unsigned int pagetier_default_scan_period_ms; /* sysfs default_scan_period_ms */
extern unsigned int pagetier_max_targets;	     /* sysfs max_targets */
struct pagetier_attach;
int pagetier_targets_init(void);
void pagetier_targets_exit(void);
long pagetier_target_attach(const struct file *owner, const struct pagetier_attach *a,
			    const struct pagetier_mode_ops *ops);
long pagetier_target_detach(pid_t pid);
void pagetier_detach_owned(const struct file *owner);
struct pagetier_target *pagetier_target_get(pid_t pid);
void pagetier_target_put(struct pagetier_target *t);
int pagetier_targets_emit(char *buf);
void pagetier_count_access(struct pagetier_target *t, unsigned long index);
struct pagetier_target *pagetier_find_mm_rcu(struct mm_struct *mm);
ssize_t pagetier_uint_store(const char *buf, size_t count, unsigned int *knob, unsigned int lo,
			    unsigned int hi);

/*
 * PT_DEFINE_UINT_KNOB() - the show and store functions of a sysfs attribute @name that reads
 * and sets the unsigned int @var, a write outside [@lo, @hi] refused (pagetier_uint_store()).
 */
#define PT_DEFINE_UINT_KNOB(name, var, lo, hi)						\
static ssize_t name##_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)	\
{											\
	return sysfs_emit(buf, "%u\n", READ_ONCE(var));				\
}											\
static ssize_t name##_store(struct kobject *kobj, struct kobj_attribute *attr,		\
			    const char *buf, size_t count)				\
{											\
	return pagetier_uint_store(buf, count, &(var), lo, hi);				\
}

/* walk.c */
/**
 * struct pagetier_walk - what to do with each mapping of a target.
 * @pte:	called for each present PTE of a tracked VMA, page-table lock held.
 * @pmd:	called for each huge PMD of a tracked VMA, PMD lock held.
 * @unlocked:	called after each page table's lock is released (may sleep); may be NULL.
 * @t:		the target; the walk covers t->mm (the caller holds t->mm_lock or is its scan).
 * @priv:	the caller's.
 * @cursor:	in: the address pagetier_walk_all() starts at (0: the lowest VMA); out: where a
 *		walk cut short by @budget resumes, 0 when it covered every VMA.
 * @budget:	work the walk may do before it stops (0: no limit), in page-table entries
 *		examined, a present one counting as several (walk.c's WALK_PRESENT_COST).
 * @entries:	out: page-table entries examined, at every level.
 * @units:	out: present PTEs and huge PMDs handed to @pte and @pmd.
 * @idle:	may be NULL. When set, the walk tests and clears the Accessed bit of each upper-level
 *		entry (PUD, and PMD pointing to a page table) before it descends, and calls @idle
 *		for one whose bit was clear with the range of region indices (address >> PMD_SHIFT)
 *		below it that the walk covers: true skips the entry's table. No lock held.
 * @memo_pud, @memo_pmd, @memo_pud_young, @memo_pmd_young: the last upper-level entry tested
 *		(index + 1) and its bit, so that VMAs sharing a table see one test: in and out.
 * @upper_only: only clear the Accessed bit of each upper-level entry (PUD, and PMD pointing to a
 *		page table, the PMD under its lock), call nothing and descend no further: the start
 *		of a short window (scan.c). @idle, @pte, @pmd and the memos are not used.
 * @restore:	walk every walkable VMA (pagetier_vma_walkable()), not only those the target
 *		tracks: a restore undoes marks wherever they may be.
 */
struct pagetier_walk {
	void (*pte)(struct pagetier_walk *w, struct vm_area_struct *vma, unsigned long addr,
		    pte_t *ptep);
	void (*pmd)(struct pagetier_walk *w, struct vm_area_struct *vma, unsigned long addr,
		    pmd_t *pmdp);
	void (*unlocked)(struct pagetier_walk *w);
	struct pagetier_target *t;
	void *priv;
	bool protects; /* @pte or @pmd may change protections (mmu notifier invalidation) */
	unsigned long cursor;
	unsigned long budget;
	unsigned long entries;
	unsigned long units;
	bool (*idle)(struct pagetier_walk *w, unsigned long first, unsigned long last);
	/* of @n page tables in a row from region @first, unused: how many from the first on
	 * were carried over (the next one, if any, is to be read) */
	unsigned long (*idle_run)(struct pagetier_walk *w, unsigned long first, unsigned long n);
	unsigned long memo_pud, memo_pmd;
	bool memo_pud_young, memo_pmd_young;
	bool upper_only;
	bool peek;		/* with upper_only: count the PUDs whose Accessed bit is set, clear none */
	unsigned long young;	/* what peek counted */
	bool restore;
	/* the range of the page table (or huge mapping) walk_pmds() just read, before unlocked() */
	unsigned long table_start, table_end;
};
bool pagetier_vma_walkable(struct vm_area_struct *vma);
bool pagetier_vma_tracked(const struct pagetier_target *t, struct vm_area_struct *vma);
int pagetier_page_kind(struct page *page, bool *shared);
pte_t *pagetier_pte_map_lock(struct mm_struct *mm, pmd_t *pmd, unsigned long addr,
			     spinlock_t **ptl);
void pagetier_walk_all(struct pagetier_walk *w);
bool pagetier_walk_addr(struct pagetier_walk *w, unsigned long addr);

/* scan.c */
int pagetier_scan(struct pagetier_target *t);

/* region.c */
void pagetier_region_note(struct pagetier_target *t, unsigned long region, unsigned int present,
			  unsigned int node, bool mixed, bool huge, unsigned long kinds,
			  bool in_parts);
bool pagetier_region_idle(struct pagetier_target *t, unsigned long first, unsigned long last,
			  bool read_used, u64 *units, u64 *shmem, u64 *file);
unsigned long pagetier_region_idle_run(struct pagetier_target *t, unsigned long first,
				       unsigned long n, bool read_used, u64 *units, u64 *shmem,
				       u64 *file);
void pagetier_region_rewalk(struct pagetier_target *t, const u64 *addrs, unsigned long nr);
void pagetier_region_drop_stale(struct pagetier_target *t);
bool pagetier_region_carried(struct pagetier_target *t, unsigned long r);
unsigned int pagetier_regions_chunk(struct pagetier_target *t, u32 flags, unsigned long *index,
				    unsigned long last, struct pagetier_region *out,
				    unsigned int want, bool *more, struct pagetier_record *pages,
				    unsigned int *nr_pages);

/* probe.c */
/**
 * struct pagetier_probe_list - the units a scan found accessed: the probe's work list.
 * @u:		per unit: index << PT_PU_SHIFT | hits << 2 | armed << 1 | huge, in address order.
 * @nr:		units listed.
 * @cap:	room in @u.
 */
struct pagetier_probe_list {
	unsigned long *u;
	unsigned int nr, cap;
};
#define PT_PU_SHIFT 8
bool pagetier_probe_enabled(const struct pagetier_target *t);
bool pagetier_probe_due(const struct pagetier_target *t, unsigned long index, bool huge,
			bool estimated);
void pagetier_probe_note(struct pagetier_probe_list *l, unsigned long index, bool huge);
void pagetier_probe(struct pagetier_target *t, struct pagetier_probe_list *l);
u32 pagetier_entry_freq(const struct pagetier_target *t, unsigned long v);
bool pagetier_sleep_us(struct pagetier_target *t, unsigned long us);
extern unsigned int pagetier_probe_marks;
extern struct kobj_attribute pagetier_probe_windows_attr;
extern struct kobj_attribute pagetier_probe_base_us_attr;
extern struct kobj_attribute pagetier_probe_every_attr;
extern struct kobj_attribute pagetier_probe_fault_marks_attr;
void pagetier_flush_range(struct mm_struct *mm, unsigned long start, unsigned long end);

/**
 * struct pagetier_inval - an mmu notifier invalidation in progress (secondary MMUs: KVM,
 * devices sharing the page table), started only when the address space has notifiers.
 * @range:	what the notifiers were told.
 * @on:		whether they were (end it).
 */
struct pagetier_inval {
#ifdef CONFIG_MMU_NOTIFIER
	struct mmu_notifier_range range;
#endif
	bool on;
};
void pagetier_inval_start(struct pagetier_inval *iv, struct vm_area_struct *vma,
			  unsigned long start, unsigned long end);
void pagetier_inval_end(struct pagetier_inval *iv);
bool pagetier_young(struct vm_area_struct *vma, unsigned long addr, unsigned long size,
		    unsigned long *word, bool clear);

/* ksyms.c: kernel functions not exported to modules, looked up at load time */
int pagetier_ksyms_init(void);
extern void (*pt_flush_tlb_mm_range)(struct mm_struct *mm, unsigned long start,
				      unsigned long end, unsigned int stride_shift,
				      bool freed_tables);
extern bool (*pt_ptrace_may_access)(struct task_struct *task, unsigned int mode);
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 5, 0)
extern pte_t *(*pt_pte_offset_map_lock)(struct mm_struct *mm, pmd_t *pmd, unsigned long addr,
					spinlock_t **ptlp);
#endif
#ifdef CONFIG_MMU_NOTIFIER
extern int (*pt_mn_invalidate_range_start)(struct mmu_notifier_range *r);
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 6, 0)
extern void (*pt_mn_invalidate_range_end)(struct mmu_notifier_range *r);
#else
extern void (*pt_mn_invalidate_range_end)(struct mmu_notifier_range *r, bool only_end);
#endif
extern int (*pt_mn_clear_young)(struct mm_struct *mm, unsigned long start, unsigned long end);
extern int (*pt_mn_test_young)(struct mm_struct *mm, unsigned long address);
#endif

/* modes */
extern const struct pagetier_mode_ops pagetier_fault_ops;
extern const struct pagetier_mode_ops pagetier_abit_ops;
int pagetier_fault_init(void);
void pagetier_fault_exit(void);

/* compat: write permission helpers changed signature in 6.6 */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 6, 0)
#define pt_pte_mkwrite(pte) pte_mkwrite_novma(pte)
#define pt_pmd_mkwrite(pmd) pmd_mkwrite_novma(pmd)
#else
#define pt_pte_mkwrite(pte) pte_mkwrite(pte)
#define pt_pmd_mkwrite(pmd) pmd_mkwrite(pmd)
#endif

#endif /* _PAGETIER_H */
