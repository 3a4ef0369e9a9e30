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

static pte_t *pt_map_lock(struct mm_struct *mm, pmd_t *pmd, unsigned long addr, spinlock_t **ptl)
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

/* Walk [start, end) of @vma, calling @w's functions on each present PTE and huge PMD. */
static void walk_range(struct pagetier_walk *w, struct vm_area_struct *vma, unsigned long start,
		       unsigned long end)
{
	struct mm_struct *mm = vma->vm_mm;
	unsigned long addr = start, next;

	for (; addr < end; addr = next) {
		pgd_t *pgd;
		p4d_t *p4d;
		pud_t *pud;
		pmd_t *pmd, pmdval;
		spinlock_t *ptl;
		pte_t *pte, *start_pte;

		next = pmd_addr_end(addr, end);
		pgd = pgd_offset(mm, addr);
		if (pgd_none(*pgd) || pgd_bad(*pgd))
			continue;
		p4d = p4d_offset(pgd, addr);
		if (p4d_none(*p4d) || p4d_bad(*p4d))
			continue;
		pud = pud_offset(p4d, addr);
		if (pud_none(*pud) || pud_trans_huge(*pud) || pud_bad(*pud))
			continue;
		pmd = pmd_offset(pud, addr);
		pmdval = READ_ONCE(*pmd);
		if (pmd_none(pmdval))
			continue;
		if (pmd_trans_huge(pmdval) || pmd_devmap(pmdval)) {
			ptl = pmd_lock(mm, pmd);
			/* a huge PMD lies whole inside one VMA */
			if (pmd_trans_huge(*pmd) && !pmd_devmap(*pmd) && pmd_present(*pmd) &&
			    (addr & HPAGE_PMD_MASK) >= vma->vm_start &&
			    (addr & HPAGE_PMD_MASK) + HPAGE_PMD_SIZE <= vma->vm_end)
				w->pmd(w, vma, addr & HPAGE_PMD_MASK, pmd);
			spin_unlock(ptl);
		} else {
			start_pte = pte = pt_map_lock(mm, pmd, addr, &ptl);
			if (!pte)
				continue;
			for (; addr < next; addr += PAGE_SIZE, pte++) {
				if (pte_present(ptep_get(pte)))
					w->pte(w, vma, addr, pte);
			}
			pte_unmap_unlock(start_pte, ptl);
		}
		if (w->unlocked)
			w->unlocked(w);
		cond_resched();
	}
}

/**
 * pagetier_walk_all() - walk every tracked VMA of @w->t.
 * @w: what to call; the caller holds t->mm's users and its mmap_lock for read.
 */
void pagetier_walk_all(struct pagetier_walk *w)
{
	struct vm_area_struct *vma;
	VMA_ITERATOR(vmi, w->t->mm, 0);

	for_each_vma(vmi, vma) {
		if (!pagetier_vma_tracked(vma))
			continue;
		walk_range(w, vma, vma->vm_start, vma->vm_end);
		if (w->t->ops->flush)
			pagetier_flush_range(w->t->mm, vma->vm_start, vma->vm_end);
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

static void scan_unlocked(struct pagetier_walk *w)
{
	struct scan_batch *b = w->priv;
	unsigned int i;

	for (i = 0; i < b->n; i++) {
		if (record(w->t, &b->seen[i], b->probing) && b->probing)
			pagetier_probe_note(&b->probe, b->seen[i].index, b->seen[i].huge);
		if (b->seen[i].accessed)
			atomic64_inc(&w->t->accesses);
	}
	b->tracked += b->n;
	b->n = 0;
}

/* Forget pages the scan did not see (unmapped since the last scan). */
static void drop_stale(struct pagetier_target *t)
{
	XA_STATE(xas, &t->pages, 0);
	void *entry;
	unsigned int n = 0;

	xas_lock(&xas);
	xas_for_each(&xas, entry, ULONG_MAX) {
		if (((xa_to_value(entry) & PT_GEN_MASK) >> PT_GEN_SHIFT) != t->gen)
			xas_store(&xas, NULL);
		if (++n % 4096 == 0) {
			xas_pause(&xas);
			xas_unlock(&xas);
			cond_resched();
			xas_lock(&xas);
		}
	}
	xas_unlock(&xas);
}

/**
 * pagetier_scan() - one scan of a target: the mode checks and (re)arms every present page.
 * @t: the target. Called from its delayed work only.
 *
 * Return: 0, or -ESRCH once the target's address space is gone.
 */
int pagetier_scan(struct pagetier_target *t)
{
	struct pagetier_walk w = { .pte = scan_pte, .pmd = scan_pmd, .unlocked = scan_unlocked,
				   .t = t };
	u64 t0 = ktime_get_ns();
	u64 last_tracked = t->pages_tracked;
	struct scan_batch *b;

	if (!mmget_not_zero(t->mm))
		return -ESRCH;
	b = kmalloc(sizeof(*b), GFP_KERNEL);
	if (!b) {
		mmput(t->mm);
		return -ENOMEM;
	}
	w.priv = b;
	b->n = 0;
	b->tracked = 0;
	b->probing = pagetier_probe_enabled(t);
	b->probe = (struct pagetier_probe_list){};
	/* a page budget turns into a sampling ratio that spreads the marks over the space */
	t->ratio_now = max_t(u32, t->sample_ratio, 1);
	if (t->page_budget && last_tracked > t->page_budget)
		t->ratio_now = max_t(u64, t->ratio_now, DIV_ROUND_UP(last_tracked, t->page_budget));
	t->marked_now = 0;
	t->gen++;
	mmap_read_lock(t->mm);
	pagetier_walk_all(&w);
	mmap_read_unlock(t->mm);
	mmput(t->mm);
	t->pages_tracked = b->tracked;
	drop_stale(t);
	t->scan_ns += ktime_get_ns() - t0;
	/* then, over the units accessed in the last period only, the frequency probes */
	pagetier_probe(t, &b->probe);
	kvfree(b->probe.u);
	kfree(b);
	t->scans++; /* a reader waiting for this scan finds its frequencies too */
	return 0;
}
