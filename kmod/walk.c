// SPDX-License-Identifier: GPL-2.0
/*
 * The page-table walker: walk a target's page tables (the kernel's walk_page_range is not
 * exported, and apply_to_existing_page_range warns on huge PMDs) and hand each present PTE or
 * huge PMD to the caller's functions, with the helpers the modes share (TLB flush, mmu notifier
 * invalidation, Accessed bits). The scan (scan.c), the probes and the modes' restores use it;
 * it calls none of them.
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
 * pagetier_vma_walkable() - whether the walks may look at the page tables of @vma.
 * @vma: a VMA of a target, mmap_lock held.
 *
 * Return: true for accessible, ordinary mappings; false for hugetlbfs, I/O and PFN maps,
 * userfaultfd write-protected ranges and shadow stacks. The restores (detach, UNMARK) walk
 * every such VMA, whatever the target tracks.
 */
bool pagetier_vma_walkable(struct vm_area_struct *vma)
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
 * pagetier_vma_tracked() - whether the scan tracks pages of @vma for @t.
 * @t: the target.
 * @vma: a VMA of the target, mmap_lock held.
 *
 * A read-only file mapping (shared libraries' text and read-only data, a data file mapped
 * PROT_READ) is left out unless the target was attached with PAGETIER_ATTACH_READONLY_FILES:
 * the kernel's NUMA balancing leaves the same VMAs out (task_numa_work), as pages many
 * processes share read-only gain little from a move.
 *
 * Return: true if the scan looks at its pages.
 */
bool pagetier_vma_tracked(const struct pagetier_target *t, struct vm_area_struct *vma)
{
	if (!pagetier_vma_walkable(vma))
		return false;
	if (vma->vm_file && (vma->vm_flags & (VM_READ | VM_WRITE)) == VM_READ &&
	    !(t->attach_flags & PAGETIER_ATTACH_READONLY_FILES))
		return false;
	return true;
}

/**
 * pagetier_page_kind() - the kind of memory a mapped page is, or none pagetier tracks.
 * @page: a page mapped by a present PTE or huge PMD (its page-table lock held).
 * @shared: if not NULL, set to whether its folio is mapped more than once (by other
 *	    processes, or shared copy-on-write after a fork): move_pages(2) moves such a page only
 *	    with MPOL_MF_MOVE_ALL. An estimate for a large folio mapped in parts, as the kernel's.
 *
 * The kind is the folio's, not the VMA's: a private file mapping's pages written since are
 * anonymous. Left out: KSM pages and other non-LRU "movable" pages, pages without a mapping
 * (the zero page and the huge zero page, a page cache page being truncated), zone-device pages.
 *
 * Return: PT_KIND_ANON, PT_KIND_SHMEM or PT_KIND_FILE; -1 for a page left out.
 */
int pagetier_page_kind(struct page *page, bool *shared)
{
	struct folio *folio = page_folio(page);
	unsigned long mapping = (unsigned long)READ_ONCE(folio->mapping);
	int kind;

	if (is_zone_device_page(page))
		return -1;
	if ((mapping & PAGE_MAPPING_FLAGS) == PAGE_MAPPING_ANON)
		kind = PT_KIND_ANON;
	else if (mapping && !(mapping & PAGE_MAPPING_FLAGS))
		/* shmem folios are swap-backed, page cache of a filesystem is not */
		kind = folio_test_swapbacked(folio) ? PT_KIND_SHMEM : PT_KIND_FILE;
	else
		return -1;
	if (shared)
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 9, 0) /* folio_likely_mapped_shared() from 6.9 */
		*shared = folio_likely_mapped_shared(folio);
#else
		*shared = page_mapcount(page) > 1;
#endif
	return kind;
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
	/*
	 * Tested before it is cleared, as x86's ptep_test_and_clear_young() does: most entries a
	 * pass reads have the bit clear, and a locked clear of each would cost an atomic operation
	 * for nothing. A bit the CPU sets between the test and the clear stays set for the next
	 * pass, as if the access came after this one.
	 */
	bool young = test_bit(_PAGE_BIT_ACCESSED, word) &&
		     (!clear || test_and_clear_bit(_PAGE_BIT_ACCESSED, word));

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
		*young = test_bit(_PAGE_BIT_ACCESSED, (unsigned long *)entry) &&
			 test_and_clear_bit(_PAGE_BIT_ACCESSED, (unsigned long *)entry);
	}
	return *young;
}

static bool pmd_is_table(pmd_t val)
{
	return pmd_present(val) && !pmd_trans_huge(val) && !pmd_devmap(val) && !pmd_bad(val);
}

/*
 * Whether a PMD read without its lock points to a page table and has its Accessed bit clear: then
 * nothing is to be cleared, and the lock is not taken. Any other value (the bit set, a huge or
 * non-present PMD, one changing meanwhile) is looked at again under the lock.
 */
static bool pmd_table_clear_unlocked(pmd_t *pmd)
{
	pmd_t val = READ_ONCE(*pmd); /* one word on x86-64 */

	return pmd_is_table(val) && !(pmd_val(val) & _PAGE_ACCESSED);
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
	if (pmd_table_clear_unlocked(pmd)) { /* most PMDs after a window: not used in it */
		w->memo_pmd = (addr >> PMD_SHIFT) + 1;
		w->memo_pmd_young = false;
		return false;
	}
	ptl = pmd_lock(vma->vm_mm, pmd);
	val = *pmd;
	if (pmd_is_table(val))
		young = upper_young(pmd, addr >> PMD_SHIFT, &w->memo_pmd, &w->memo_pmd_young);
	spin_unlock(ptl);
	return young;
}

/*
 * The start of a short window (scan.c): clear the Accessed bit of a PMD pointing to a page
 * table, under its lock and only while it points to one, as pmd_table_young() tests it. The
 * result is not kept: the walk after the window tests the bit again.
 */
static void pmd_table_clear(struct vm_area_struct *vma, pmd_t *pmd)
{
	spinlock_t *ptl;
	pmd_t val;

	if (pmd_table_clear_unlocked(pmd))
		return;
	ptl = pmd_lock(vma->vm_mm, pmd);
	val = *pmd;

	if (pmd_is_table(val))
		clear_bit(_PAGE_BIT_ACCESSED, (unsigned long *)pmd);
	spin_unlock(ptl);
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

/* unused page tables in a row carried over in one call of the walk's idle_run */
#define PMD_RUN 64

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
		if (w->upper_only) { /* clear a table's bit; a huge PMD is the page's own */
			if (pmd_present(pmdval) && !pmd_trans_huge(pmdval) && !pmd_devmap(pmdval))
				pmd_table_clear(vma, pmd);
			cond_resched();
			if (walk_spent(w))
				return next;
			continue;
		}
		/*
		 * A page table not used since the last pass: its region is carried over, with
		 * those of the unused tables that follow it (up to PMD_RUN in one call).
		 */
		if (w->idle_run && pmd_present(pmdval) && !pmd_trans_huge(pmdval) &&
		    !pmd_devmap(pmdval) && !pmd_table_young(w, vma, pmd, addr)) {
			unsigned long n = 1, last = (end - 1) >> PMD_SHIFT;

			while (n < PMD_RUN && (addr >> PMD_SHIFT) + n <= last &&
			       pmd_table_clear_unlocked(pmd + n))
				n++;
			n = w->idle_run(w, addr >> PMD_SHIFT, n);
			if (n) {
				w->entries += n - 1;
				pmd += n - 1;
				next = min(end, (addr & PMD_MASK) + n * PMD_SIZE);
				continue;
			}
		}
		w->table_start = addr;
		w->table_end = next;
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
		if (w->upper_only && w->peek) {
			w->young += test_bit(_PAGE_BIT_ACCESSED, (unsigned long *)pud);
			continue;
		}
		if (w->upper_only)
			clear_bit(_PAGE_BIT_ACCESSED, (unsigned long *)pud);
		else if (w->idle &&
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
		if (!(w->restore ? pagetier_vma_walkable(vma) : pagetier_vma_tracked(w->t, vma)))
			continue;
		from = max(start, vma->vm_start);
		if (walk_spent(w)) {
			w->cursor = from;
			return;
		}
		stop = walk_range(w, vma, from, vma->vm_end);
		if (w->t->ops->flush && stop > from && !w->peek)
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
 * Return: true if @addr lies in a tracked VMA (walkable, for a restore).
 */
bool pagetier_walk_addr(struct pagetier_walk *w, unsigned long addr)
{
	struct vm_area_struct *vma = find_vma(w->t->mm, addr);

	addr &= PAGE_MASK;
	if (!vma || addr < vma->vm_start ||
	    !(w->restore ? pagetier_vma_walkable(vma) : pagetier_vma_tracked(w->t, vma)))
		return false;
	walk_range(w, vma, addr, addr + PAGE_SIZE);
	return true;
}
