// SPDX-License-Identifier: GPL-2.0
/*
 * The scan core: walk a target's page tables (the kernel's walk_page_range is not exported, and
 * apply_to_existing_page_range warns on huge PMDs), hand each present PTE or huge PMD to the
 * mode's ops, and record what it saw in the target's xarray. Knows nothing of how a mode works.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/mm.h>
#include <linux/hugetlb.h>
#include <linux/ktime.h>
#include <linux/pgtable.h>
#include <linux/sched/mm.h>
#include <linux/string.h>

#include "pagetier.h"


/**
 * pagetier_vma_tracked() - whether pagetier tracks pages of @vma.
 * @vma: a VMA of a target, mmap_lock held.
 *
 * Return: true for accessible, ordinary mappings; false for hugetlbfs, I/O and PFN maps,
 * userfaultfd write-protected ranges and shadow stacks.
 */
bool pagetier_vma_tracked(struct vm_area_struct *vma)
{
	if (!vma_is_accessible(vma) || is_vm_hugetlb_page(vma))
		return false;
	if (vma->vm_flags & (VM_IO | VM_PFNMAP | VM_MIXEDMAP | VM_UFFD_WP))
		return false;
#ifdef VM_SHADOW_STACK
	if (vma->vm_flags & VM_SHADOW_STACK)
		return false;
#endif
	return true;
}

/**
 * pagetier_page_is_plain_anon() - an anonymous, non-KSM page.
 * @page: a mapped page.
 *
 * Return: true if @page belongs to an anonymous folio that KSM does not share.
 */
bool pagetier_page_is_plain_anon(struct page *page)
{
	unsigned long mapping = (unsigned long)READ_ONCE(compound_head(page)->mapping);

	return (mapping & PAGE_MAPPING_FLAGS) == PAGE_MAPPING_ANON;
}

/**
 * pagetier_flush_range() - flush the TLB of @mm for [@start, @end) on every CPU.
 * @mm: the address space.
 * @start: first address.
 * @end: end address (exclusive).
 */
void pagetier_flush_range(struct mm_struct *mm, unsigned long start, unsigned long end)
{
	pt_flush_tlb_mm_range(mm, start, end, PAGE_SHIFT, false);
}

/**
 * pagetier_inval_start() - tell secondary MMUs that [@start, @end) of @vma changes protection.
 * @iv: the invalidation, ended with pagetier_inval_end().
 * @vma: the VMA; its mmap_lock held.
 * @start: first address.
 * @end: end address (exclusive).
 *
 * What the kernel's change_protection() does around its PTE changes, with the header's inline
 * (whose out-of-line part is not exported) done here: nothing unless the address space has
 * notifiers. A KVM guest or a device then drops its own mapping of the range and faults it in
 * again through the PTE, which takes the hinting fault that counts the access.
 *
 * Context: may sleep; no page-table lock held.
 */
void pagetier_inval_start(struct pagetier_inval *iv, struct vm_area_struct *vma,
			  unsigned long start, unsigned long end)
{
	iv->on = false;
#ifdef CONFIG_MMU_NOTIFIER
	if (!mm_has_notifiers(vma->vm_mm))
		return;
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 3, 0)
	mmu_notifier_range_init(&iv->range, MMU_NOTIFY_PROTECTION_VMA, 0, vma->vm_mm, start, end);
#else
	mmu_notifier_range_init(&iv->range, MMU_NOTIFY_PROTECTION_VMA, 0, vma, vma->vm_mm, start,
				end);
#endif
	iv->range.flags |= MMU_NOTIFIER_RANGE_BLOCKABLE;
	pt_mn_invalidate_range_start(&iv->range);
	iv->on = true;
#endif
}

/**
 * pagetier_inval_end() - end an invalidation pagetier_inval_start() began.
 * @iv: the invalidation.
 *
 * Context: may sleep; no page-table lock held.
 */
void pagetier_inval_end(struct pagetier_inval *iv)
{
#ifdef CONFIG_MMU_NOTIFIER
	if (!iv->on)
		return;
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 6, 0)
	pt_mn_invalidate_range_end(&iv->range);
#else
	pt_mn_invalidate_range_end(&iv->range, false); /* and the secondary TLBs' invalidate_range */
#endif
	iv->on = false;
#endif
}

/**
 * pagetier_young() - test (and clear) the Accessed bit of a PTE or huge PMD, secondary MMUs
 * included, as the kernel's ptep_clear_young_notify() does.
 * @vma: the VMA.
 * @addr: the first address the entry maps.
 * @size: how many bytes it maps (PAGE_SIZE or HPAGE_PMD_SIZE).
 * @word: the entry.
 * @clear: clear the bits too.
 *
 * Context: the entry's page-table lock held (the notifiers' young callbacks do not sleep).
 * Return: true if the CPU or a secondary MMU (a KVM guest, a device) accessed the range since
 * the bits were last cleared.
 */
bool pagetier_young(struct vm_area_struct *vma, unsigned long addr, unsigned long size,
		    unsigned long *word, bool clear)
{
	bool young = clear ? test_and_clear_bit(_PAGE_BIT_ACCESSED, word) :
			     test_bit(_PAGE_BIT_ACCESSED, word);

#ifdef CONFIG_MMU_NOTIFIER
	if (mm_has_notifiers(vma->vm_mm)) {
		if (clear)
			young |= pt_mn_clear_young(vma->vm_mm, addr, addr + size) != 0;
		else
			young |= pt_mn_test_young(vma->vm_mm, addr) != 0;
	}
#endif
	return young;
}

/**
 * pagetier_pte_map_lock() - map the page table under @pmd and take its lock.
 * @mm: the address space.
 * @pmd: a PMD entry of @mm.
 * @addr: an address the PMD covers.
 * @ptl: set to the page-table lock taken.
 *
 * Context: mmap_lock held. Return: the PTE of @addr, or NULL when @pmd maps no page table (none,
 * huge or bad); release with pte_unmap_unlock().
 */
pte_t *pagetier_pte_map_lock(struct mm_struct *mm, pmd_t *pmd, unsigned long addr,
			     spinlock_t **ptl)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 5, 0)
	return pt_pte_offset_map_lock(mm, pmd, addr, ptl);
#else
	pmd_t pmdval = READ_ONCE(*pmd);

	if (pmd_none(pmdval) || pmd_trans_huge(pmdval) || pmd_devmap(pmdval) || pmd_bad(pmdval))
		return NULL;
	return pte_offset_map_lock(mm, pmd, addr, ptl);
#endif
}

/*
 * The walk: one function per page-table level, each stepping over its entries at its own size,
 * so an empty PGD, P4D or PUD entry costs one check however much address space it covers (a
 * sparse multi-TiB reservation costs what its populated page tables cost). Runs of empty PUD,
 * PMD and PTE entries are skipped by zero_run(), eight entries per test. Each level counts the
 * entries it examines in w->entries and calls cond_resched() once per entry it looks at one by
 * one above the PMD level (a run of empty PUD entries counts as one) and once per populated PMD
 * entry, so no path runs more than one table's worth of checks without a chance to reschedule. A walk with a budget stops after the page table at
 * which the budget ran out; each level returns the address it stopped at (@end when it covered
 * the range). A walk whose functions change protections (w->protects) tells the mmu notifiers
 * around each populated PMD entry it handles.
 */

/* In the budget, a present entry costs this many empty ones: the mode's work and the record. */
#define WALK_PRESENT_COST 32

static bool walk_spent(const struct pagetier_walk *w)
{
	return w->budget && w->entries + WALK_PRESENT_COST * w->units >= w->budget;
}

/*
 * Test and clear the Accessed bit of an upper-level entry (a PUD, or a PMD pointing to a page
 * table) the first time the walk meets it; VMAs sharing the table see that first result (@memo:
 * the entry's index + 1). The CPU sets the bit when it walks through the entry to fill its TLB;
 * x86's pmd_bad() and pud_bad() accept the bit clear in a table entry, as the kernel's own
 * multi-gen LRU clears it. The walk flushes the TLB for what it covered, so the next access
 * walks (and sets the bit) again.
 */
static bool upper_young(void *entry, unsigned long index, unsigned long *memo, bool *young)
{
	if (*memo != index + 1) {
		*memo = index + 1;
		*young = test_and_clear_bit(_PAGE_BIT_ACCESSED, (unsigned long *)entry);
	}
	return *young;
}

/*
 * The same for a PMD, under its lock and only while it points to a page table: khugepaged may
 * turn a table into a huge mapping (or empty it) under the PMD lock with only the mmap_lock
 * read, and a non-present PMD (a migration entry) keeps other bits where Accessed would be.
 * A PUD pointing to a table changes only under the mmap_lock held for write.
 */
static bool pmd_table_young(struct pagetier_walk *w, struct vm_area_struct *vma, pmd_t *pmd,
			    unsigned long addr)
{
	spinlock_t *ptl;
	pmd_t val;
	bool young = true;

	if (w->memo_pmd == (addr >> PMD_SHIFT) + 1)
		return w->memo_pmd_young;
	ptl = pmd_lock(vma->vm_mm, pmd);
	val = *pmd;
	if (pmd_present(val) && !pmd_trans_huge(val) && !pmd_devmap(val) && !pmd_bad(val))
		young = upper_young(pmd, addr >> PMD_SHIFT, &w->memo_pmd, &w->memo_pmd_young);
	spin_unlock(ptl);
	return young;
}

/*
 * How many of the @n entries of @size bytes from @p on are all zero (empty): the common case in
 * the tables of a sparse mapping, where a populated table holds one entry in 512. Eight words
 * are ORed per step and tested once (a table costs 64 tests, not 512), then memchr_inv finds
 * the first non-zero byte in the block that has one. An entry that is not all zero is left to
 * the caller's own check. The tables above the PTE level are read without their lock here, as
 * the kernel's walkers do: an entry filled meanwhile is seen by the next scan.
 */
static unsigned long zero_run(const void *p, unsigned long n, size_t size)
{
	const unsigned long *w = p, *end = (const unsigned long *)((const u8 *)p + n * size);
	const u8 *nz;

	while (end - w >= 8 &&
	       !(READ_ONCE(w[0]) | READ_ONCE(w[1]) | READ_ONCE(w[2]) | READ_ONCE(w[3]) |
		 READ_ONCE(w[4]) | READ_ONCE(w[5]) | READ_ONCE(w[6]) | READ_ONCE(w[7])))
		w += 8;
	nz = memchr_inv(w, 0, (const u8 *)end - (const u8 *)w);
	return nz ? (nz - (const u8 *)p) / size : n;
}

static void walk_ptes(struct pagetier_walk *w, struct vm_area_struct *vma, pmd_t *pmd,
		      unsigned long addr, unsigned long end)
{
	unsigned long i, nr = (end - addr) >> PAGE_SHIFT;
	spinlock_t *ptl;
	pte_t *pte;

	pte = pagetier_pte_map_lock(vma->vm_mm, pmd, addr, &ptl);
	if (!pte)
		return;
	w->entries += nr;
	for (i = zero_run(pte, nr, sizeof(*pte)); i < nr;
	     i += 1 + zero_run(pte + i + 1, nr - i - 1, sizeof(*pte))) {
		if (pte_present(ptep_get(pte + i))) {
			w->pte(w, vma, addr + (i << PAGE_SHIFT), pte + i);
			w->units++;
		}
	}
	pte_unmap_unlock(pte, ptl);
}

static unsigned long walk_pmds(struct pagetier_walk *w, struct vm_area_struct *vma, pud_t *pud,
			       unsigned long addr, unsigned long end)
{
	pmd_t *pmd = pmd_offset(pud, addr), pmdval;
	struct pagetier_inval iv;
	unsigned long next, skip;
	spinlock_t *ptl;

	for (; addr < end; pmd++, addr = next) {
		skip = zero_run(pmd, ((end - 1) >> PMD_SHIFT) - (addr >> PMD_SHIFT) + 1,
				sizeof(*pmd));
		if (skip) {
			w->entries += skip;
			pmd += skip;
			addr = (addr & PMD_MASK) + skip * PMD_SIZE;
			if (addr >= end)
				break;
		}
		next = pmd_addr_end(addr, end);
		w->entries++;
		pmdval = READ_ONCE(*pmd);
		if (pmd_none(pmdval))
			continue;
		/* a page table not used since the last pass: its region is carried over */
		if (w->idle && pmd_present(pmdval) && !pmd_trans_huge(pmdval) &&
		    !pmd_devmap(pmdval) && !pmd_table_young(w, vma, pmd, addr) &&
		    w->idle(w, addr >> PMD_SHIFT, addr >> PMD_SHIFT))
			continue;
		if (w->protects) /* the whole entry: a huge one changes whole */
			pagetier_inval_start(&iv, vma, max(addr & PMD_MASK, vma->vm_start),
					     min((addr & PMD_MASK) + PMD_SIZE, vma->vm_end));
		if (pmd_trans_huge(pmdval) || pmd_devmap(pmdval)) {
			ptl = pmd_lock(vma->vm_mm, pmd);
			/* a huge PMD lies whole inside one VMA */
			if (pmd_trans_huge(*pmd) && !pmd_devmap(*pmd) && pmd_present(*pmd) &&
			    (addr & HPAGE_PMD_MASK) >= vma->vm_start &&
			    (addr & HPAGE_PMD_MASK) + HPAGE_PMD_SIZE <= vma->vm_end) {
				w->pmd(w, vma, addr & HPAGE_PMD_MASK, pmd);
				w->units++;
			}
			spin_unlock(ptl);
		} else {
			walk_ptes(w, vma, pmd, addr, next);
		}
		if (w->protects)
			pagetier_inval_end(&iv);
		if (w->unlocked)
			w->unlocked(w);
		cond_resched();
		if (walk_spent(w))
			return next;
	}
	return end;
}

static unsigned long walk_puds(struct pagetier_walk *w, struct vm_area_struct *vma, p4d_t *p4d,
			       unsigned long addr, unsigned long end)
{
	pud_t *pud = pud_offset(p4d, addr), pudval;
	unsigned long next, stop, skip;

	for (; addr < end; pud++, addr = next) {
		skip = zero_run(pud, ((end - 1) >> PUD_SHIFT) - (addr >> PUD_SHIFT) + 1,
				sizeof(*pud));
		if (skip) {
			w->entries += skip;
			pud += skip;
			addr = (addr & PUD_MASK) + skip * PUD_SIZE;
			if (addr >= end)
				break;
		}
		next = pud_addr_end(addr, end);
		w->entries++;
		cond_resched();
		pudval = READ_ONCE(*pud);
		if (pud_none(pudval) || pud_trans_huge(pudval) || pud_bad(pudval))
			continue;
		if (w->idle &&
		    !upper_young(pud, addr >> PUD_SHIFT, &w->memo_pud, &w->memo_pud_young) &&
		    w->idle(w, addr >> PMD_SHIFT, (next - 1) >> PMD_SHIFT))
			continue;
		stop = walk_pmds(w, vma, pud, addr, next);
		if (stop != next)
			return stop;
	}
	return end;
}

static unsigned long walk_p4ds(struct pagetier_walk *w, struct vm_area_struct *vma, pgd_t *pgd,
			       unsigned long addr, unsigned long end)
{
	p4d_t *p4d = p4d_offset(pgd, addr), p4dval;
	unsigned long next, stop;

	for (; addr < end; p4d++, addr = next) {
		next = p4d_addr_end(addr, end);
		w->entries++;
		cond_resched();
		p4dval = READ_ONCE(*p4d);
		if (p4d_none(p4dval) || p4d_bad(p4dval))
			continue;
		stop = walk_puds(w, vma, p4d, addr, next);
		if (stop != next)
			return stop;
	}
	return end;
}

/*
 * Walk [start, end) of @vma, calling @w's functions on each present PTE and huge PMD.
 * Return: @end, or the address where the walk stopped because @w's budget was spent.
 */
static unsigned long walk_range(struct pagetier_walk *w, struct vm_area_struct *vma,
				unsigned long start, unsigned long end)
{
	pgd_t *pgd = pgd_offset(vma->vm_mm, start), pgdval;
	unsigned long addr = start, next, stop;

	for (; addr < end; pgd++, addr = next) {
		next = pgd_addr_end(addr, end);
		w->entries++;
		cond_resched();
		pgdval = READ_ONCE(*pgd);
		if (pgd_none(pgdval) || pgd_bad(pgdval))
			continue;
		stop = walk_p4ds(w, vma, pgd, addr, next);
		if (stop != next)
			return stop;
	}
	return end;
}

/**
 * pagetier_walk_all() - walk every tracked VMA of @w->t from @w->cursor on.
 * @w: what to call; the caller holds t->mm's users and its mmap_lock for read.
 *
 * A walk with a budget (@w->budget) that spends it stops between two page tables and leaves
 * in @w->cursor the address the next walk starts at; otherwise @w->cursor ends 0. For a mode
 * that asks for it, the TLB is flushed for every range walked before this returns.
 */
void pagetier_walk_all(struct pagetier_walk *w)
{
	struct mm_struct *mm = w->t->mm;
	unsigned long start = w->cursor, from, stop;
	struct vm_area_struct *vma;
	struct vma_iterator vmi;

	vma_iter_init(&vmi, mm, start);
	w->cursor = 0;
	for_each_vma(vmi, vma) {
		if (!pagetier_vma_tracked(vma))
			continue;
		from = max(start, vma->vm_start);
		if (walk_spent(w)) {
			w->cursor = from;
			return;
		}
		stop = walk_range(w, vma, from, vma->vm_end);
		if (w->t->ops->flush && stop > from)
			pagetier_flush_range(mm, from, stop);
		if (stop < vma->vm_end) {
			w->cursor = stop;
			return;
		}
	}
}

/**
 * pagetier_walk_addr() - call @w's functions on the mapping of the page holding @addr.
 * @w: what to call; the caller holds t->mm's users and its mmap_lock for read.
 * @addr: a user address of the target.
 *
 * Return: true if @addr lies in a tracked VMA.
 */
bool pagetier_walk_addr(struct pagetier_walk *w, unsigned long addr)
{
	struct vm_area_struct *vma = find_vma(w->t->mm, addr);

	addr &= PAGE_MASK;
	if (!vma || addr < vma->vm_start || !pagetier_vma_tracked(vma))
		return false;
	walk_range(w, vma, addr, addr + PAGE_SIZE);
	return true;
}

/* --- the scan --- */

struct pt_seen {
	unsigned long index;
	unsigned int node;
	bool huge;
	bool accessed;
};

/* What the scan collects under one page-table lock; applied to the xarray after the unlock. */
struct scan_batch {
	unsigned int n;
	u64 tracked;
	u64 walked; /* pages in the page tables (and huge mappings) read */
	bool probing;
	struct pagetier_probe_list probe; /* units accessed in the last period, for probe.c */
	struct pt_seen seen[PTRS_PER_PTE];
};

static bool in_sample(struct pagetier_target *t, unsigned long unit)
{
	if (t->page_budget && t->marked_now >= t->page_budget)
		return false;
	return t->ratio_now <= 1 || (unit + t->scans) % t->ratio_now == 0;
}

static void scan_pte(struct pagetier_walk *w, struct vm_area_struct *vma, unsigned long addr,
		     pte_t *ptep)
{
	struct pagetier_target *t = w->t;
	struct scan_batch *b = w->priv;
	unsigned long index = addr >> PAGE_SHIFT;
	pte_t pte = ptep_get(ptep);
	bool acc;

	if (pte_special(pte))
		return;
	/* the first scan only arms: counting starts with the attach */
	acc = t->ops->pte(t, vma, addr, ptep, in_sample(t, index)) && t->scans;
	b->seen[b->n++] = (struct pt_seen){ index, page_to_nid(pte_page(pte)), false, acc };
}

static void scan_pmd(struct pagetier_walk *w, struct vm_area_struct *vma, unsigned long addr,
		     pmd_t *pmdp)
{
	struct pagetier_target *t = w->t;
	struct scan_batch *b = w->priv;
	unsigned long index = addr >> PAGE_SHIFT;
	unsigned int nid = page_to_nid(pmd_page(*pmdp));
	bool acc;

	acc = t->ops->pmd(t, vma, addr, pmdp, in_sample(t, addr >> HPAGE_PMD_SHIFT)) && t->scans;
	b->seen[b->n++] = (struct pt_seen){ index, nid, true, acc };
}

/*
 * Store what the scan saw of one unit. Return: true if the unit was accessed in the last period
 * (its Accessed bit, or a fault or probe hit since the previous scan): the probes look at it.
 */
static bool record(struct pagetier_target *t, const struct pt_seen *s, bool probing)
{
	XA_STATE(xas, &t->pages, s->index);
	unsigned long old, v;
	bool listed;
	void *entry;

	do {
		xas_lock(&xas);
		entry = xas_load(&xas);
		old = xa_is_value(entry) ? xa_to_value(entry) : 0;
		listed = s->accessed || (old & PT_SEEN);
		v = (old & (PT_COUNT_MASK | PT_PROBE_MASK)) |
		    ((unsigned long)(s->node + 1) << PT_NODE_SHIFT) | (s->huge ? PT_HUGE : 0) |
		    ((unsigned long)t->gen << PT_GEN_SHIFT);
		/* not accessed: no frequency; accessed: the last estimate stands until the probe's */
		if (!listed || !probing)
			v &= ~PT_PROBE_MASK;
		if (s->accessed && (v & PT_COUNT_MASK) != PT_COUNT_MASK)
			v++;
		xas_store(&xas, xa_mk_value(v));
		if (s->accessed && !xas_error(&xas))
			xas_set_mark(&xas, PT_ACCESSED);
		xas_unlock(&xas);
	} while (xas_nomem(&xas, GFP_KERNEL));
	return listed;
}

/* One page table (or huge mapping) read: its region. */
static void note_region(struct pagetier_target *t, const struct scan_batch *b)
{
	unsigned int i, node = b->seen[0].node, present = b->seen[0].huge ? PT_REGION_PAGES : b->n;
	bool mixed = false;

	for (i = 1; i < b->n && !mixed; i++)
		mixed = b->seen[i].node != node;
	pagetier_region_note(t, b->seen[0].index >> (PMD_SHIFT - PAGE_SHIFT), present, node, mixed,
			     b->seen[0].huge);
}

/*
 * The walk met an upper-level entry whose Accessed bit was clear: carry its regions over,
 * except that every pud_refresh passes each PUD's table is read again (staggered by PUD), so
 * that a page table the kernel filled below an unused PUD is found.
 */
static bool scan_idle(struct pagetier_walk *w, unsigned long first, unsigned long last)
{
	struct pagetier_target *t = w->t;
	struct scan_batch *b = w->priv;
	unsigned int refresh = READ_ONCE(pagetier_pud_refresh);

	if (first != last && refresh &&
	    ((first >> (PUD_SHIFT - PMD_SHIFT)) + t->scans) % refresh == 0)
		return false;
	return pagetier_region_idle(t, first, last, &b->tracked);
}

static void scan_unlocked(struct pagetier_walk *w)
{
	struct scan_batch *b = w->priv;
	unsigned int i;

	if (b->n) {
		note_region(w->t, b);
		b->walked += b->seen[0].huge ? PT_REGION_PAGES : b->n;
	}
	for (i = 0; i < b->n; i++) {
		if (record(w->t, &b->seen[i], b->probing) && b->probing)
			pagetier_probe_note(&b->probe, b->seen[i].index, b->seen[i].huge);
		if (b->seen[i].accessed)
			atomic64_inc(&w->t->accesses);
	}
	b->tracked += b->n;
	b->n = 0;
}

/**
 * pagetier_scan() - one period's scan of a target: the mode checks and (re)arms present pages.
 * @t: the target. Called from its delayed work only.
 *
 * A pass covers every tracked VMA. A period walks at most pagetier_scan_budget's worth of it
 * (0: no limit) and leaves a cursor where the next period resumes; the pass ends (scans + 1,
 * pages not seen forgotten) in the period that reaches the last VMA.
 *
 * Return: 0, or -ESRCH once the target's address space is gone.
 */
int pagetier_scan(struct pagetier_target *t)
{
	struct pagetier_walk w = { .pte = scan_pte, .pmd = scan_pmd, .unlocked = scan_unlocked,
				   .t = t, .protects = t->ops->protects };
	u64 t0 = ktime_get_ns();
	struct scan_batch *b;

	if (!mmget_not_zero(t->mm))
		return -ESRCH;
	b = kmalloc(sizeof(*b), GFP_KERNEL);
	if (!b) {
		mmput(t->mm);
		return -ENOMEM;
	}
	b->n = 0;
	b->tracked = 0;
	b->walked = 0;
	b->probing = pagetier_probe_enabled(t);
	b->probe = (struct pagetier_probe_list){};
	w.priv = b;
	if (!t->pass_started) {
		/*
		 * A page budget turns into a sampling ratio that spreads the marks over the pages
		 * the last pass read, not over the footprint: tables not used since are skipped.
		 */
		t->ratio_now = max_t(u32, t->sample_ratio, 1);
		if (t->page_budget && t->walked_last > t->page_budget)
			t->ratio_now = max_t(u64, t->ratio_now,
					     DIV_ROUND_UP(t->walked_last, t->page_budget));
		t->marked_now = 0;
		t->tracked_now = 0;
		t->walked_now = 0;
		t->memo_pud = 0;
		t->memo_pmd = 0;
		t->cursor = 0;
		t->gen++;
		t->pass_started = true;
	}
	w.cursor = t->cursor;
	w.budget = READ_ONCE(pagetier_scan_budget);
	/* the first pass reads every table: no region is known yet */
	if (READ_ONCE(pagetier_upper_bits) && t->scans)
		w.idle = scan_idle;
	w.memo_pud = t->memo_pud;
	w.memo_pmd = t->memo_pmd;
	w.memo_pud_young = t->memo_pud_young;
	w.memo_pmd_young = t->memo_pmd_young;
	mmap_read_lock(t->mm);
	pagetier_walk_all(&w);
	mmap_read_unlock(t->mm);
	mmput(t->mm);
	t->memo_pud = w.memo_pud;
	t->memo_pmd = w.memo_pmd;
	t->memo_pud_young = w.memo_pud_young;
	t->memo_pmd_young = w.memo_pmd_young;
	t->tracked_now += b->tracked;
	t->walked_now += b->walked;
	t->cursor = w.cursor;
	if (!w.cursor) {
		WRITE_ONCE(t->pages_tracked, t->tracked_now);
		t->walked_last = t->walked_now;
		pagetier_region_drop_stale(t);
		t->pass_started = false;
	}
	t0 = ktime_get_ns() - t0;
	/* then, over the units this period found accessed in the last one only, the probes */
	pagetier_probe(t, &b->probe);
	kvfree(b->probe.u);
	kfree(b);
	/*
	 * The walk's figures next to scans (nothing sleeps in between), so that a reader sees the
	 * ones of the passes scans counts, not those of a pass whose probes still run.
	 */
	WRITE_ONCE(t->walk_entries, t->walk_entries + w.entries);
	WRITE_ONCE(t->scan_ns, t->scan_ns + t0);
	if (w.cursor)
		WRITE_ONCE(t->scan_resumes, t->scan_resumes + 1);
	else /* after the probes: a reader waiting for this scan finds its frequencies */
		WRITE_ONCE(t->scans, t->scans + 1);
	return 0;
}
