// SPDX-License-Identifier: GPL-2.0
/*
 * Frequency probes: after each scan, the units the scan found accessed in the last period go
 * through K short windows of geometric lengths (base, 4 base, 16 base, ...). Each window arms
 * every listed unit through the mode's probe ops (abit: clear the Accessed bit; fault: mark the
 * unit inaccessible), flushes the TLB, sleeps with mmap_lock dropped, and tests which units were
 * accessed meanwhile. A unit touched at rate f is hit by a window of length w with probability
 * 1 - exp(-f w): the number of windows hit tells its rate within a factor of about the ratio of
 * two windows, over the range 1 / (longest window) .. 1 / (shortest window); a unit accessed in
 * the period but in no window is slower than the longest one. The hits go into the unit's
 * xarray entry; READ turns them into accesses per second with the window lengths measured at
 * the last probe. The cost follows the accessed set, never the whole address space.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/delay.h>
#include <linux/ktime.h>
#include <linux/mm.h>
#include <linux/pgtable.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/sort.h>
#include <linux/sysfs.h>

#include "pagetier.h"

/* knobs (sysfs): windows per probe (0: no probes) and the shortest window's sleep */
static unsigned int probe_windows = 5;
static unsigned int probe_base_us = 250;
/*
 * A listed unit whose entry holds an estimate is probed again in one pass of every
 * probe_every (staggered by unit): its estimate is at most that many periods old. A unit with
 * no estimate (newly accessed, or not accessed in the period before) is probed in its first
 * pass, so a program's move to new memory is measured as soon as it is seen. The default, 1,
 * probes every listed unit in every pass: at 4 the probes of a steady hot set cost a quarter,
 * but the daemon followed phase changes worse (docs/frequency.md).
 */
static unsigned int probe_every = 1;
#define PROBE_EVERY_MAX 64
/* fault mode: probe with hinting marks (1) rather than the Accessed bit (0); see mode_fault.c */
unsigned int pagetier_probe_marks;
#define PROBE_BASE_US_MIN 100
#define PROBE_BASE_US_MAX 10000

/* a probe list entry: index << PT_PU_SHIFT | hits << 2 | armed << 1 | huge */
#define PU_HUGE 1UL
#define PU_ARMED 2UL
#define PU_HITS_SHIFT 2
#define PU_HITS_MASK (0xfUL << PU_HITS_SHIFT)
#define PU_PROBED (1UL << 6) /* armed by the first window: its hits are an estimate */

/**
 * pagetier_probe_enabled() - whether the scans of @t list units for the probes.
 * @t: the target.
 *
 * Return: true if probes are on and the mode can probe.
 */
bool pagetier_probe_enabled(const struct pagetier_target *t)
{
	return READ_ONCE(probe_windows) && t->ops->probe_pte && t->ops->probe_pmd;
}

/**
 * pagetier_probe_due() - whether this pass probes a unit the scan found accessed.
 * @t: the target; called from its scan work.
 * @index: the unit's address >> PAGE_SHIFT.
 * @huge: a huge PMD mapping.
 * @estimated: its entry holds the result of an earlier probe (kept while it stays accessed).
 *
 * Return: true if it has no estimate, or it is its turn among one in probe_every passes.
 */
bool pagetier_probe_due(const struct pagetier_target *t, unsigned long index, bool huge,
			bool estimated)
{
	unsigned int every = READ_ONCE(probe_every);
	unsigned long unit = huge ? index >> (HPAGE_PMD_SHIFT - PAGE_SHIFT) : index;

	return !estimated || every <= 1 || (unit + t->scans) % every == 0;
}

/**
 * pagetier_probe_note() - list a unit the scan found accessed.
 * @l: the scan's probe list.
 * @index: the unit's address >> PAGE_SHIFT (units come in address order).
 * @huge: a huge PMD mapping.
 *
 * Context: may sleep (allocates). A unit that finds no room is not probed.
 */
void pagetier_probe_note(struct pagetier_probe_list *l, unsigned long index, bool huge)
{
	if (l->nr == l->cap) {
		unsigned int cap = max(2 * l->cap, 1024U);
		unsigned long *u = kvmalloc_array(cap, sizeof(*u), GFP_KERNEL);

		if (!u)
			return;
		if (l->nr)
			memcpy(u, l->u, l->nr * sizeof(*u));
		kvfree(l->u);
		l->u = u;
		l->cap = cap;
	}
	l->u[l->nr++] = (index << PT_PU_SHIFT) | (huge ? PU_HUGE : 0);
}

/* The PMD entry covering @addr, or NULL if no page table reaches it. */
static pmd_t *probe_pmd_of(struct mm_struct *mm, unsigned long addr)
{
	pgd_t *pgd = pgd_offset(mm, addr);
	p4d_t *p4d;
	pud_t *pud;
	pmd_t *pmd;

	if (pgd_none(*pgd) || pgd_bad(*pgd))
		return NULL;
	p4d = p4d_offset(pgd, addr);
	if (p4d_none(*p4d) || p4d_bad(*p4d))
		return NULL;
	pud = pud_offset(p4d, addr);
	if (pud_none(*pud) || pud_trans_huge(*pud) || pud_bad(*pud))
		return NULL;
	pmd = pmd_offset(pud, addr);
	return pmd_none(READ_ONCE(*pmd)) ? NULL : pmd;
}

/* Fold one probe step's result @r into the list entry @u. */
static void probe_apply(unsigned long *u, unsigned int r, bool test, bool arm, bool first)
{
	unsigned long e = *u;

	if (test && (e & PU_ARMED) && (r & PT_PROBE_HIT) && (e & PU_HITS_MASK) != PU_HITS_MASK)
		e += 1UL << PU_HITS_SHIFT;
	if (arm) {
		e &= ~PU_ARMED;
		if (r & PT_PROBE_ARMED)
			e |= PU_ARMED | (first ? PU_PROBED : 0);
	}
	*u = e;
}

/*
 * One pass over the list (mmap_lock held for read): test what the last pass armed and arm for
 * the next window. Units in one page table share one lock. Return: the range to flush.
 */
static void probe_pass(struct pagetier_target *t, struct pagetier_probe_list *l, bool test,
		       bool arm, bool first, unsigned long *lo, unsigned long *hi)
{
	const struct pagetier_mode_ops *ops = t->ops;
	struct mm_struct *mm = t->mm;
	struct vm_area_struct *vma = NULL;
	unsigned int i = 0, batches = 0;
	bool marks = arm && ops->protects && READ_ONCE(pagetier_probe_marks);
	struct pagetier_inval iv;

	*lo = ULONG_MAX;
	*hi = 0;
	while (i < l->nr) {
		unsigned long addr = (l->u[i] >> PT_PU_SHIFT) << PAGE_SHIFT, end, first_addr;
		pte_t *pte, *start_pte;
		spinlock_t *ptl;
		pmd_t *pmd;

		if (!vma || addr < vma->vm_start || addr >= vma->vm_end) {
			vma = find_vma(mm, addr);
			if (vma && (addr < vma->vm_start || !pagetier_vma_tracked(t, vma)))
				vma = NULL;
		}
		pmd = vma ? probe_pmd_of(mm, addr) : NULL;
		if (!pmd) {
			probe_apply(&l->u[i++], 0, test, arm, first);
			continue;
		}
		*lo = min(*lo, addr);
		/* marks change protections: secondary MMUs drop the range first */
		if (marks)
			pagetier_inval_start(&iv, vma, max(addr & PMD_MASK, vma->vm_start),
					     min(pmd_addr_end(addr, vma->vm_end), vma->vm_end));
		if (pmd_trans_huge(READ_ONCE(*pmd)) || pmd_devmap(READ_ONCE(*pmd))) {
			unsigned long start = addr & HPAGE_PMD_MASK;
			unsigned int r = 0;

			ptl = pmd_lock(mm, pmd);
			if (pmd_trans_huge(*pmd) && !pmd_devmap(*pmd) && pmd_present(*pmd) &&
			    start >= vma->vm_start && start + HPAGE_PMD_SIZE <= vma->vm_end)
				r = ops->probe_pmd(t, vma, start, pmd, test, arm);
			spin_unlock(ptl);
			*hi = max(*hi, start + HPAGE_PMD_SIZE);
			/* units listed as small pages before a collapse share the result */
			do {
				probe_apply(&l->u[i++], r, test, arm, first);
			} while (i < l->nr &&
				 ((l->u[i] >> PT_PU_SHIFT) << PAGE_SHIFT) < start + HPAGE_PMD_SIZE);
		} else {
			pte = pagetier_pte_map_lock(mm, pmd, addr, &ptl);
			if (!pte) {
				if (marks)
					pagetier_inval_end(&iv);
				probe_apply(&l->u[i++], 0, test, arm, first);
				continue;
			}
			start_pte = pte - pte_index(addr);
			first_addr = addr & PMD_MASK;
			end = min(pmd_addr_end(addr, vma->vm_end), vma->vm_end);
			do {
				pte_t *p = start_pte + pte_index(addr);
				pte_t v = ptep_get(p);
				unsigned int r = 0;

				/* a unit listed huge and split since: its first small page stands in */
				if (pte_present(v) && !pte_special(v))
					r = ops->probe_pte(t, vma, addr, p, test, arm);
				probe_apply(&l->u[i++], r, test, arm, first);
				*hi = max(*hi, addr + PAGE_SIZE);
				if (i == l->nr)
					break;
				addr = (l->u[i] >> PT_PU_SHIFT) << PAGE_SHIFT;
			} while (addr >= first_addr && addr < end); /* the list is in address order */
			pte_unmap_unlock(pte, ptl);
		}
		if (marks)
			pagetier_inval_end(&iv);
		if (++batches % 32 == 0)
			cond_resched();
	}
}

/**
 * pagetier_sleep_us() - sleep @us in slices, so that a detach waits little.
 * @t: the target; called from its scan work, no lock held.
 * @us: how long.
 *
 * Return: false if the target is being detached (stop what the sleep was for).
 */
bool pagetier_sleep_us(struct pagetier_target *t, unsigned long us)
{
	while (!READ_ONCE(t->stopping)) {
		unsigned long slice = min(us, 20UL * USEC_PER_MSEC);

		if (!us)
			return true;
		usleep_range(slice, slice + slice / 8 + 20);
		us -= slice;
	}
	return false;
}

/* Store each unit's result (1 + windows hit, or 0) in its entry; a hit means seen. */
static void probe_store(struct pagetier_target *t, const struct pagetier_probe_list *l)
{
	XA_STATE(xas, &t->pages, 0);
	unsigned int i;
	void *entry;

	xas_lock(&xas);
	for (i = 0; i < l->nr; i++) {
		unsigned long u = l->u[i], v, hits = (u & PU_HITS_MASK) >> PU_HITS_SHIFT;

		/*
		 * The list is in address order: a run of pages takes the next slot, not a descent
		 * from the root (but not after an xas_pause(), which moved the index on itself).
		 */
		if (i % 1024 && (u >> PT_PU_SHIFT) == (l->u[i - 1] >> PT_PU_SHIFT) + 1) {
			entry = xas_next(&xas);
		} else {
			xas_set(&xas, u >> PT_PU_SHIFT);
			entry = xas_load(&xas);
		}
		if (!xa_is_value(entry))
			continue; /* dropped meanwhile */
		v = xa_to_value(entry) & ~PT_PROBE_MASK;
		if (u & PU_PROBED)
			v |= min(hits + 1, PT_PROBE_MASK >> PT_PROBE_SHIFT) << PT_PROBE_SHIFT;
		if (hits)
			v |= PT_SEEN;
		xas_store(&xas, xa_mk_value(v)); /* replaces a present entry: no allocation */
		if (i % 1024 == 1023) {
			xas_pause(&xas);
			xas_unlock(&xas);
			cond_resched();
			xas_lock(&xas);
		}
	}
	xas_unlock(&xas);
}

static int cmp_u32(const void *a, const void *b)
{
	u32 x = *(const u32 *)a, y = *(const u32 *)b;

	return x < y ? -1 : x > y;
}

/**
 * pagetier_probe() - measure how often each unit of @l is accessed, and store the result.
 * @t: the target; called from its scan work, right after the scan that built @l.
 * @l: the units accessed in the last period, in address order.
 *
 * Takes the target's mmap_lock for each pass and drops it for each window's sleep. Ends early,
 * storing nothing, when the target is detached or its address space goes away meanwhile.
 */
void pagetier_probe(struct pagetier_target *t, struct pagetier_probe_list *l)
{
	unsigned int k = min_t(unsigned int, READ_ONCE(probe_windows), PT_PROBE_MAX_WINDOWS);
	unsigned long base = READ_ONCE(probe_base_us), lo, hi;
	u64 start[PT_PROBE_MAX_WINDOWS + 1], busy = 0, t0;
	u32 win[PT_PROBE_MAX_WINDOWS];
	struct mm_struct *mm = t->mm;
	unsigned int i;

	if (!k || !l->nr || !pagetier_probe_enabled(t))
		return;
	for (i = 0; i <= k; i++) {
		t0 = ktime_get_ns();
		if (!mmget_not_zero(mm))
			break;
		mmap_read_lock(mm);
		start[i] = ktime_get_ns();
		probe_pass(t, l, i > 0, i < k, i == 0, &lo, &hi);
		/* a cached translation would neither set the Accessed bit nor fault */
		if (i < k && lo < hi)
			pagetier_flush_range(mm, lo, hi);
		mmap_read_unlock(mm);
		mmput(mm);
		busy += ktime_get_ns() - t0;
		if (i < k && !pagetier_sleep_us(t, base << (2 * i)))
			break;
	}
	if (i <= k)
		goto out; /* cut short: the last estimates stand until the next scan */
	for (i = 0; i < k; i++)
		win[i] = max_t(u64, div_u64(start[i + 1] - start[i], NSEC_PER_USEC), 1);
	sort(win, k, sizeof(win[0]), cmp_u32, NULL);
	t0 = ktime_get_ns();
	probe_store(t, l);
	busy += ktime_get_ns() - t0;
	for (i = 0; i < k; i++)
		WRITE_ONCE(t->probe_win_us[i], win[i]);
	WRITE_ONCE(t->probe_k, k);
	WRITE_ONCE(t->units_probed, t->units_probed + l->nr);
out:
	WRITE_ONCE(t->probe_ns, t->probe_ns + busy);
}

/**
 * pagetier_entry_freq() - estimated accesses per second of a unit in the last scan period.
 * @t: the target.
 * @v: the unit's xarray value.
 *
 * With h of the K windows hit, the rate is about 1 / (the (K-h+1)-th shortest window): a window
 * of length w catches a unit of rate 1/w with probability 0.63, the 4 times longer one with 0.98
 * and the 4 times shorter one with 0.22, so h counts the windows longer than 1/rate. None hit:
 * slower than the longest window, and at least once in the period.
 *
 * Return: accesses per second (at least 1), or 0 if the unit was not accessed in the last
 * period or has no estimate.
 */
u32 pagetier_entry_freq(const struct pagetier_target *t, unsigned long v)
{
	unsigned int r = (v & PT_PROBE_MASK) >> PT_PROBE_SHIFT, k = READ_ONCE(t->probe_k), h;
	u32 longest, slow;

	if (!r || !k)
		return 0;
	h = min(r - 1, k);
	if (h)
		return max_t(u32, USEC_PER_SEC / READ_ONCE(t->probe_win_us[k - h]), 1);
	longest = READ_ONCE(t->probe_win_us[k - 1]);
	slow = min_t(u32, MSEC_PER_SEC / max_t(u32, t->scan_period_ms, 1),
		     USEC_PER_SEC / 2 / max_t(u32, longest, 1));
	return max_t(u32, slow, 1);
}

/* --- /sys/kernel/pagetier/probe_windows, probe_base_us, probe_fault_marks, probe_every --- */

PT_DEFINE_UINT_KNOB(probe_windows, probe_windows, 0, PT_PROBE_MAX_WINDOWS)
PT_DEFINE_UINT_KNOB(probe_base_us, probe_base_us, PROBE_BASE_US_MIN, PROBE_BASE_US_MAX)
PT_DEFINE_UINT_KNOB(probe_fault_marks, pagetier_probe_marks, 0, 1)
PT_DEFINE_UINT_KNOB(probe_every, probe_every, 1, PROBE_EVERY_MAX)

struct kobj_attribute pagetier_probe_windows_attr = __ATTR_RW(probe_windows);
struct kobj_attribute pagetier_probe_fault_marks_attr = __ATTR_RW(probe_fault_marks);
struct kobj_attribute pagetier_probe_base_us_attr = __ATTR_RW(probe_base_us);
struct kobj_attribute pagetier_probe_every_attr = __ATTR_RW(probe_every);
