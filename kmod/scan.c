// SPDX-License-Identifier: GPL-2.0
/*
 * The scan: one period's pass over a target through the walker (walk.c), handing each present
 * PTE or huge PMD to the mode's ops, recording what it saw in the target's page and region
 * tables, and then running the frequency probes. Knows nothing of how a mode works.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/mm.h>
#include <linux/ktime.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/version.h>

#include "pagetier.h"


struct pt_seen {
	unsigned long index;
	unsigned int node;
	bool huge;
	bool accessed;
	bool young;  /* the mode saw it accessed (the first pass too, which counts nothing) */
	u8 kind;     /* PT_KIND_* */
	bool shared; /* mapped more than once */
	bool listed; /* set by record_batch(): accessed in the last period, for the probes */
	bool estimated; /* set by record_batch(): its entry holds a probe's result */
};

/* What the scan collects under one page-table lock; applied to the xarray after the unlock. */
struct scan_batch {
	unsigned int n;
	u64 tracked;
	u64 shmem, file; /* of tracked, shmem and file-backed units */
	u64 walked; /* pages in the page tables (and huge mappings) read */
	bool probing;
	unsigned long region;	/* the region of the units below, and whether they are left */
	bool no_marks;		/* unmarked: UNMARK named it (pages being moved) */
	bool windowed;		/* the period began with a window (scan_window()) */
	struct pagetier_probe_list probe; /* units accessed in the last period, for probe.c */
	struct pt_seen seen[PTRS_PER_PTE];
	bool done[PTRS_PER_PTE]; /* record_batch(): which of seen[] merge_table() stored */
};

static bool in_sample(struct pagetier_target *t, unsigned long unit)
{
	if (t->page_budget && t->marked_now >= t->page_budget)
		return false;
	return t->ratio_now <= 1 || (unit + t->scans) % t->ratio_now == 0;
}

/*
 * Whether the units of the region holding @index may be marked in this pass. Before 6.6
 * move_pages skips a page left PROT_NONE (follow_page honoured NUMA hinting faults), so a
 * region UNMARK named, which holds pages the daemon is moving, is left unmarked by the pass
 * that re-reads it. From 6.6 move_pages moves such pages (6.12 finds them through
 * folio_walk_start), and marking goes on: a unit left unmarked takes no fault and gets no count
 * or estimate in that pass.
 */
static bool sample_region(struct pagetier_target *t, struct scan_batch *b, unsigned long index)
{
	unsigned long r = index >> (PMD_SHIFT - PAGE_SHIFT);
	void *entry;

	if (LINUX_VERSION_CODE >= KERNEL_VERSION(6, 6, 0))
		return true;
	if (r != b->region) {
		b->region = r;
		entry = xa_load(&t->regions, r);
		b->no_marks = xa_is_value(entry) && (xa_to_value(entry) & PR_REWALK);
	}
	return !b->no_marks;
}

static void scan_pte(struct pagetier_walk *w, struct vm_area_struct *vma, unsigned long addr,
		     pte_t *ptep)
{
	struct pagetier_target *t = w->t;
	struct scan_batch *b = w->priv;
	unsigned long index = addr >> PAGE_SHIFT;
	pte_t pte = ptep_get(ptep);
	bool acc, young, shared;
	int kind;

	if (pte_special(pte))
		return;
	kind = pagetier_page_kind(pte_page(pte), &shared);
	if (kind < 0)
		return;
	young = t->ops->pte(t, vma, addr, ptep, sample_region(t, b, index) && in_sample(t, index));
	/* the first scan only arms: counting starts with the attach */
	acc = young && t->scans;
	b->seen[b->n++] = (struct pt_seen){ index, page_to_nid(pte_page(pte)), false, acc, young,
					    kind, shared };
}

static void scan_pmd(struct pagetier_walk *w, struct vm_area_struct *vma, unsigned long addr,
		     pmd_t *pmdp)
{
	struct pagetier_target *t = w->t;
	struct scan_batch *b = w->priv;
	unsigned long index = addr >> PAGE_SHIFT;
	unsigned int nid = page_to_nid(pmd_page(*pmdp));
	bool acc, young, shared;
	int kind = pagetier_page_kind(pmd_page(*pmdp), &shared);

	if (kind < 0) /* the huge zero page among others */
		return;
	young = t->ops->pmd(t, vma, addr, pmdp,
			    sample_region(t, b, index) && in_sample(t, addr >> HPAGE_PMD_SHIFT));
	acc = young && t->scans;
	b->seen[b->n++] = (struct pt_seen){ index, nid, true, acc, young, kind, shared };
}

/* The page entry @old (0: none) as the scan saw unit @s this pass; @gen: its generation. */
static unsigned long seen_val(struct pt_seen *s, unsigned long old, bool probing,
			      unsigned long gen)
{
	unsigned long v;

	s->listed = s->accessed || (old & PT_SEEN);
	s->estimated = old & PT_PROBE_MASK;
	v = (old & (PT_COUNT_MASK | PT_PROBE_MASK)) |
	    ((unsigned long)(s->node + 1) << PT_NODE_SHIFT) | (s->huge ? PT_HUGE : 0) |
	    (gen << PT_GEN_SHIFT) |
	    ((unsigned long)s->kind << PT_KIND_SHIFT) | (s->shared ? PT_SHARED : 0);
	/* not accessed: no frequency; accessed: the last estimate stands until the probe's */
	if (!s->listed || !probing)
		v &= ~PT_PROBE_MASK;
	if (s->accessed && (v & PT_COUNT_MASK) != PT_COUNT_MASK)
		v++;
	return v;
}

/*
 * A table the walk read whole (its VMA covers all of its 2 MiB): the entries of its region are
 * merged with what the scan saw, in one pass over them under the lock. An entry the scan did
 * not see is gone (unmapped, freed, or now inside a huge mapping) and is erased here; one it
 * saw is stored only if it changed, so the pages of a table that nobody touched cost a load
 * each, not a store. Their generation is left as it was: it is only read for a region read in
 * parts (record_batch()). Sets done[i] for each unit that had an entry.
 */
static void merge_table(struct pagetier_target *t, struct scan_batch *b, bool *done)
{
	unsigned long first = b->seen[0].index & ~(PT_REGION_PAGES - 1UL);
	XA_STATE(xas, &t->pages, first);
	unsigned long old, v;
	unsigned int i = 0;
	void *entry;

	xas_lock(&xas);
	xas_for_each(&xas, entry, first + PT_REGION_PAGES - 1) {
		unsigned long index = xas.xa_index;

		while (i < b->n && b->seen[i].index < index)
			i++;
		if (i == b->n || b->seen[i].index != index) {
			xas_store(&xas, NULL); /* not seen in a table read whole: gone */
			continue;
		}
		old = xa_to_value(entry);
		v = seen_val(&b->seen[i], old, b->probing, (old & PT_GEN_MASK) >> PT_GEN_SHIFT);
		if (v != old)
			xas_store(&xas, xa_mk_value(v)); /* replaces a value: no allocation */
		if (b->seen[i].accessed)
			xas_set_mark(&xas, PT_ACCESSED);
		done[i] = true;
	}
	xas_unlock(&xas);
}

/*
 * Store what the scan saw of a batch's units (one page table, or a huge mapping), under one hold
 * of the xarray's lock: taken for each unit, the lock cost more than the stores. A unit whose
 * entry needs a node the lock's non-sleeping allocation did not get is retried after an
 * allocation that may sleep, with the lock dropped; one that finds no memory is left as it was.
 * Sets each unit's ``listed``: accessed in the last period (its Accessed bit, or a fault or probe
 * hit since the previous scan), so that the probes look at it.
 *
 * @whole: the walk read the table whole (merge_table(): the units already tracked are merged in
 * place, and only new ones are stored here). Otherwise (a VMA boundary inside its 2 MiB) every
 * unit is stored with this pass's generation, and the end of the pass forgets the region's
 * entries of an older one (pagetier_region_drop_stale()).
 */
static void record_batch(struct pagetier_target *t, struct scan_batch *b, bool whole)
{
	XA_STATE(xas, &t->pages, 0);
	bool *done = b->done;
	unsigned int i = 0;
	void *entry;

	if (!b->n)
		return;
	memset(done, 0, b->n * sizeof(*done));
	if (whole)
		merge_table(t, b, done);
	xas_lock(&xas);
	while (i < b->n) {
		struct pt_seen *s = &b->seen[i];

		if (done[i]) {
			i++;
			continue;
		}
		/* a table's pages come in address order: the next page's slot is the next one's */
		if (i && !done[i - 1] && s->index == b->seen[i - 1].index + 1) {
			entry = xas_next(&xas);
		} else {
			xas_set(&xas, s->index);
			entry = xas_load(&xas);
		}
		xas_store(&xas, xa_mk_value(seen_val(s, xa_is_value(entry) ? xa_to_value(entry) : 0,
						     b->probing, t->gen)));
		if (xas_error(&xas)) {
			bool allocated;

			xas_unlock(&xas);
			allocated = xas_nomem(&xas, GFP_KERNEL);
			xas_lock(&xas);
			xas_set(&xas, s->index); /* clears the error: the next lookup from the root */
			if (!allocated)
				i++; /* no memory: the unit is left as it was */
			continue; /* else the same unit again, with the node allocated */
		}
		if (s->accessed)
			xas_set_mark(&xas, PT_ACCESSED);
		i++;
	}
	xas_unlock(&xas);
	xas_set(&xas, 0);
	xas_nomem(&xas, GFP_KERNEL); /* no error now: frees a node allocated and not used */
}

/* One page table (or huge mapping) read: its region, with the kinds of its pages. */
static void note_region(struct pagetier_target *t, const struct scan_batch *b, bool whole)
{
	unsigned int i, node = b->seen[0].node, present = b->seen[0].huge ? PT_REGION_PAGES : b->n;
	unsigned int accessed = 0;
	unsigned long kinds = 0;
	bool mixed = false;

	/*
	 * In use (PR_USED) from the pages accessed since the table's last read (listed, which
	 * record_batch() set: an Accessed bit a counting pass saw, or a hinting fault or probe hit
	 * since that read; fault mode sees accesses only so), not from the first pass's bits: those
	 * tell what was touched since the pages were mapped, all of a program that has just filled
	 * its memory, and would have the next pass read every table.
	 */
	for (i = 0; i < b->n; i++) {
		mixed |= b->seen[i].node != node;
		accessed += b->seen[i].listed;
		kinds |= (b->seen[i].kind == PT_KIND_SHMEM ? PR_SHMEM : 0) |
			 (b->seen[i].kind == PT_KIND_FILE ? PR_FILE : 0) |
			 (b->seen[i].shared ? PR_SHARED : 0);
	}
	if (accessed >= PT_USED_PAGES)
		kinds |= PR_USED;
	pagetier_region_note(t, b->seen[0].index >> (PMD_SHIFT - PAGE_SHIFT), present, node, mixed,
			     b->seen[0].huge, kinds, !whole);
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
	return pagetier_region_idle(t, first, last, b->windowed, &b->tracked, &b->shmem, &b->file);
}

/* Page tables in a row whose PMDs' Accessed bits were clear: carry their regions over. */
static unsigned long scan_idle_run(struct pagetier_walk *w, unsigned long first, unsigned long n)
{
	struct scan_batch *b = w->priv;

	return pagetier_region_idle_run(w->t, first, n, b->windowed, &b->tracked, &b->shmem,
					&b->file);
}

static void scan_unlocked(struct pagetier_walk *w)
{
	struct scan_batch *b = w->priv;
	bool whole = !(w->table_start & ~PMD_MASK) && w->table_end == w->table_start + PMD_SIZE;
	unsigned int i, accessed = 0;

	record_batch(w->t, b, whole); /* sets the units' listed, which note_region() counts */
	if (b->n) {
		note_region(w->t, b, whole);
		b->walked += b->seen[0].huge ? PT_REGION_PAGES : b->n;
	}
	for (i = 0; i < b->n; i++) {
		if (b->seen[i].listed && b->probing &&
		    pagetier_probe_due(w->t, b->seen[i].index, b->seen[i].huge,
				       b->seen[i].estimated))
			pagetier_probe_note(&b->probe, b->seen[i].index, b->seen[i].huge);
		accessed += b->seen[i].accessed;
		b->shmem += b->seen[i].kind == PT_KIND_SHMEM;
		b->file += b->seen[i].kind == PT_KIND_FILE;
	}
	if (accessed)
		atomic64_add(accessed, &w->t->accesses);
	b->tracked += b->n;
	b->n = 0;
}

/*
 * Whether the upper-level Accessed bits of @mm tell which page tables were used. A secondary
 * MMU (a KVM guest, a device) reads the pages through its own tables and sets none of the
 * CPU's: with notifiers, every table is read and the notifiers asked page by page.
 */
static bool upper_bits_tell(struct mm_struct *mm)
{
#ifdef CONFIG_MMU_NOTIFIER
	if (mm_has_notifiers(mm))
		return false;
#endif
	return true;
}

/*
 * The short window before a walk that tests the upper-level bits, in both modes. Left alone,
 * a PMD's bit covers the time since the last pass tested it, a second or more on a large
 * target: with a little of the accesses going anywhere (an allocator's
 * metadata, a lookup now and then) nearly every 2 MiB region is touched in that time, and the
 * pass reads every page table. So each period first clears the PUD and PMD (table) bits from
 * where its walk starts on, an upper-levels-only walk costing one entry per 2 MiB, flushes the
 * TLB (walk.c: the next access walks the tables and sets the bits), and sleeps
 * pagetier_upper_window_ms with the mmap_lock dropped and the address space not held; a window
 * after which no PUD entry it cleared has its bit set again (the program touched none of its
 * tracked memory: stopped, asleep, or not scheduled) is waited again, up to
 * pagetier_upper_window_max windows in all, as it tells nothing of what is in use. The walk
 * after it re-finds the VMAs and reads the tables below entries used in the window: a region in
 * use is touched within milliseconds, one touched now and then mostly is not. A region whose
 * last read found PT_USED_PAGES or more pages accessed is read again whatever its bits
 * (PR_USED), until a read finds fewer: a program that pauses, or is not scheduled, for a window
 * keeps its hot set read, and a region the odd access touched is not read on that account.
 *
 * Return: 0 with a user reference on t->mm taken again; -ESRCH if the address space is gone;
 * -EINTR if the target is being detached.
 */
static int scan_window(struct pagetier_target *t, unsigned int ms, u64 *busy,
		       unsigned long *entries)
{
	struct pagetier_walk w = { .t = t, .upper_only = true,
				   .cursor = t->pass_started ? t->cursor : 0,
				   .budget = READ_ONCE(pagetier_scan_budget) };
	struct pagetier_walk peek = { .t = t, .upper_only = true, .peek = true,
				      .cursor = w.cursor };
	unsigned int n, max = READ_ONCE(pagetier_upper_window_max);
	unsigned long start = w.cursor;
	u64 t0 = ktime_get_ns();

	mmap_read_lock(t->mm);
	pagetier_walk_all(&w);
	mmap_read_unlock(t->mm);
	mmput(t->mm);
	*busy += ktime_get_ns() - t0;
	*entries += w.entries;
	for (n = 1;; n++) {
		if (!pagetier_sleep_us(t, (unsigned long)ms * USEC_PER_MSEC))
			return -EINTR;
		if (!mmget_not_zero(t->mm))
			return -ESRCH;
		if (n >= max)
			break;
		/* the PUD bits the window cleared: none set again, the target did not run */
		t0 = ktime_get_ns();
		peek.cursor = start;
		peek.young = 0;
		mmap_read_lock(t->mm);
		pagetier_walk_all(&peek);
		mmap_read_unlock(t->mm);
		*busy += ktime_get_ns() - t0;
		if (peek.young)
			break;
		mmput(t->mm);
		atomic64_inc(&pagetier_window_waits);
	}
	*entries += peek.entries;
	return 0;
}

/**
 * pagetier_scan() - one period's scan of a target: the mode checks and (re)arms present pages.
 * @t: the target. Called from its delayed work only.
 *
 * A pass covers every tracked VMA. A period walks at most pagetier_scan_budget's worth of it
 * (0: no limit) and leaves a cursor where the next period resumes; the pass ends (scans + 1,
 * pages not seen forgotten) in the period that reaches the last VMA. A period that tests the
 * upper-level bits starts with a short window (scan_window()).
 *
 * Return: 0, or -ESRCH once the target's address space is gone.
 */
int pagetier_scan(struct pagetier_target *t)
{
	struct pagetier_walk w = { .pte = scan_pte, .pmd = scan_pmd, .unlocked = scan_unlocked,
				   .t = t, .protects = t->ops->protects };
	unsigned long window_entries = 0;
	unsigned int window_ms;
	u64 t0, busy = 0;
	struct scan_batch *b;
	bool upper, windowed = false;
	int ret;

	if (!mmget_not_zero(t->mm))
		return -ESRCH;
	/* the first pass reads every table: no region is known yet */
	upper = READ_ONCE(pagetier_upper_bits) && t->scans && upper_bits_tell(t->mm);
	window_ms = READ_ONCE(pagetier_upper_window_ms);
	if (upper && window_ms) {
		windowed = true;
		ret = scan_window(t, window_ms, &busy, &window_entries);
		if (ret) {
			WRITE_ONCE(t->walk_entries, t->walk_entries + window_entries);
			WRITE_ONCE(t->scan_ns, t->scan_ns + busy);
			return ret == -EINTR ? 0 : ret;
		}
	}
	t0 = ktime_get_ns();
	b = kmalloc(sizeof(*b), GFP_KERNEL);
	if (!b) {
		mmput(t->mm);
		return -ENOMEM;
	}
	b->n = 0;
	b->tracked = 0;
	b->shmem = 0;
	b->file = 0;
	b->walked = 0;
	b->region = ULONG_MAX;
	b->no_marks = false;
	b->windowed = windowed;
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
		t->shmem_now = 0;
		t->file_now = 0;
		t->walked_now = 0;
		t->memo_pud = 0;
		t->memo_pmd = 0;
		t->cursor = 0;
		t->gen++;
		t->pass_started = true;
	}
	w.cursor = t->cursor;
	w.budget = READ_ONCE(pagetier_scan_budget);
	if (upper) {
		w.idle = scan_idle;
		w.idle_run = scan_idle_run;
	}
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
	t->shmem_now += b->shmem;
	t->file_now += b->file;
	t->walked_now += b->walked;
	t->cursor = w.cursor;
	if (!w.cursor) {
		WRITE_ONCE(t->pages_tracked, t->tracked_now);
		WRITE_ONCE(t->pages_shmem, t->shmem_now);
		WRITE_ONCE(t->pages_file, t->file_now);
		t->walked_last = t->walked_now;
		pagetier_region_drop_stale(t);
		t->pass_started = false;
	}
	busy += ktime_get_ns() - t0;
	/* then, over the units this period found accessed in the last one only, the probes */
	pagetier_probe(t, &b->probe);
	kvfree(b->probe.u);
	kfree(b);
	/*
	 * The walk's figures next to scans (nothing sleeps in between), so that a reader sees the
	 * ones of the passes scans counts, not those of a pass whose probes still run.
	 */
	WRITE_ONCE(t->walk_entries, t->walk_entries + window_entries + w.entries);
	WRITE_ONCE(t->scan_ns, t->scan_ns + busy);
	if (w.cursor)
		WRITE_ONCE(t->scan_resumes, t->scan_resumes + 1);
	else /* after the probes: a reader waiting for this scan finds its frequencies */
		WRITE_ONCE(t->scans, t->scans + 1);
	return 0;
}
