// SPDX-License-Identifier: GPL-2.0
/*
 * The region table: one entry per 2 MiB of a target's address space that holds present pages
 * (PR_* in pagetier.h). A pass records each page table it reads as one region, and carries a
 * region over without reading its page table when the upper-level entry above it was not used
 * since the last pass (its Accessed bit was clear): the pass then costs what the used part of
 * the address space holds, not the footprint. READ_REGIONS reports the table with the per-page
 * counts of each region added up.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/mm.h>
#include <linux/xarray.h>

#include "pagetier.h"

#define PR_WALKED_LOW ((1UL << PR_WALKED_BITS) - 1)

static unsigned long region_val(unsigned int present, unsigned int node, bool mixed, bool huge,
				u8 gen, u64 pass, unsigned long kinds)
{
	return min_t(unsigned long, present, PT_REGION_PAGES) |
	       ((unsigned long)(node + 1) << PR_NODE_SHIFT & PR_NODE_MASK) |
	       (mixed ? PR_MIXED : 0) | (huge ? PR_HUGE : 0) |
	       ((unsigned long)gen << PR_GEN_SHIFT) |
	       ((unsigned long)(pass & PR_WALKED_LOW) << PR_WALKED_SHIFT) |
	       (kinds & (PR_KINDS | PR_USED));
}

static u8 region_gen(unsigned long v)
{
	return (v & PR_GEN_MASK) >> PR_GEN_SHIFT;
}

/**
 * pagetier_region_note() - record the page table (or huge mapping) a pass just read.
 * @t: the target; called from its scan work only.
 * @region: address >> PMD_SHIFT.
 * @present: present pages the pass found there.
 * @node: the node of the first of them.
 * @mixed: whether some are on another node.
 * @huge: one huge mapping.
 * @kinds: PR_SHMEM, PR_FILE, PR_SHARED: whether any of the pages is of that kind; PR_USED:
 *	   whether PT_USED_PAGES or more were accessed.
 * @in_parts: this read covered part of the table (a VMA boundary inside it): the region is
 *	      marked PR_BY_GEN, and the end of the pass forgets its page entries that no part
 *	      stored.
 *
 * VMAs that share a page table read it in parts, in one pass: the parts add up.
 * Context: may sleep (allocates); no lock held.
 */
void pagetier_region_note(struct pagetier_target *t, unsigned long region, unsigned int present,
			  unsigned int node, bool mixed, bool huge, unsigned long kinds,
			  bool in_parts)
{
	XA_STATE(xas, &t->regions, region);
	unsigned long old, v;
	void *entry;

	do {
		xas_lock(&xas);
		entry = xas_load(&xas);
		v = region_val(present, node, mixed, huge, t->gen, t->scans, kinds);
		if (xa_is_value(entry)) {
			old = xa_to_value(entry);
			/* read earlier in this pass through another VMA: add this part */
			if (region_gen(old) == t->gen && !(old & PR_IDLE)) {
				unsigned int first = ((old & PR_NODE_MASK) >> PR_NODE_SHIFT) - 1;

				v = region_val((old & PR_PRESENT_MASK) + present, first,
					       (old & PR_MIXED) || mixed || first != node,
					       huge, t->gen, t->scans,
					       (old & (PR_KINDS | PR_USED)) | kinds);
			}
		}
		xas_store(&xas, xa_mk_value(v));
		if (in_parts && !xas_error(&xas))
			xas_set_mark(&xas, PR_BY_GEN);
		xas_unlock(&xas);
	} while (xas_nomem(&xas, GFP_KERNEL));
}

/**
 * pagetier_region_idle() - carry the regions below an unused upper-level entry over this pass.
 * @t: the target; called from its scan work only.
 * @first: the first region index the walk covers below the entry.
 * @last: the last one.
 * @read_used: read the table of a region whose last read found it in use (PR_USED), whatever the
 *	       bits say (abit's window: a region stays read while it is used, and a window it
 *	       happened to miss does not drop it).
 * @units: the carried-over regions' units are added here (pages; a huge mapping is one).
 * @shmem: of them, those of regions holding shmem pages.
 * @file: of them, those of regions holding file-backed pages. A region holding pages of more
 *	  than one kind (two VMAs of different kinds in one 2 MiB) counts under each it holds:
 *	  the table keeps which kinds a region holds, not how many pages of each.
 *
 * The page table(s) are read anyway (return false) when the page table of a region is not
 * known yet (a new page table starts with its entry's Accessed bit set, but a table filled in
 * by the kernel for the process, not by its accesses, need not), when UNMARK asked for it, or
 * when this pass already read part of it through another VMA.
 *
 * Context: no lock held. Return: true if the walk may skip the entry's table.
 */
bool pagetier_region_idle(struct pagetier_target *t, unsigned long first, unsigned long last,
			  bool read_used, u64 *units, u64 *shmem, u64 *file)
{
	XA_STATE(xas, &t->regions, first);
	unsigned long v, n = 0, carried = 0, u;
	bool skip = true;
	void *entry;

	if (first == last) /* one page table: it must be known, and not huge */
		return pagetier_region_idle_run(t, first, 1, read_used, units, shmem, file) == 1;
	xas_lock(&xas);
	xas_for_each(&xas, entry, last) {
		v = xa_to_value(entry);
		if ((v & PR_REWALK) || (read_used && (v & PR_USED)) ||
		    (region_gen(v) == t->gen && !(v & PR_IDLE))) {
			skip = false;
			break;
		}
		n++;
	}
	skip = skip && n;
	if (skip) {
		xas_set(&xas, first);
		xas_for_each(&xas, entry, last) {
			v = xa_to_value(entry);
			if (region_gen(v) == t->gen) /* carried over already in this pass */
				continue;
			v = (v & ~PR_GEN_MASK) | PR_IDLE | ((unsigned long)t->gen << PR_GEN_SHIFT);
			xas_store(&xas, xa_mk_value(v)); /* replaces a value: no allocation */
			carried++;
			u = (v & PR_HUGE) ? 1 : (v & PR_PRESENT_MASK);
			*units += u;
			*shmem += (v & PR_SHMEM) ? u : 0;
			*file += (v & PR_FILE) ? u : 0;
		}
	}
	xas_unlock(&xas);
	WRITE_ONCE(t->regions_idle, t->regions_idle + carried);
	return skip;
}

/**
 * pagetier_region_idle_run() - carry over the regions of page tables in a row that were unused.
 * @t: the target; called from its scan work only.
 * @first: the region index of the first table.
 * @n: the tables in a row from @first whose PMD's Accessed bit was clear.
 * @read_used: as for pagetier_region_idle().
 * @units: as for pagetier_region_idle().
 * @shmem: as for pagetier_region_idle().
 * @file: as for pagetier_region_idle().
 *
 * Each table is carried over on the terms pagetier_region_idle() sets for one, under one hold
 * of the lock and one descent of the table for the run, up to the first that must be read.
 *
 * Context: no lock held. Return: how many from @first on were carried over (0 to @n).
 */
unsigned long pagetier_region_idle_run(struct pagetier_target *t, unsigned long first,
				       unsigned long n, bool read_used, u64 *units, u64 *shmem,
				       u64 *file)
{
	XA_STATE(xas, &t->regions, first);
	unsigned long v, i, carried = 0, u;
	void *entry;

	xas_lock(&xas);
	for (i = 0; i < n; i++) {
		entry = i ? xas_next(&xas) : xas_load(&xas);
		v = xa_is_value(entry) ? xa_to_value(entry) : 0;
		if (!v || (v & (PR_HUGE | PR_REWALK)) || (read_used && (v & PR_USED)) ||
		    (region_gen(v) == t->gen && !(v & PR_IDLE)))
			break;
		if (region_gen(v) == t->gen) /* carried over already in this pass */
			continue;
		v = (v & ~PR_GEN_MASK) | PR_IDLE | ((unsigned long)t->gen << PR_GEN_SHIFT);
		xas_store(&xas, xa_mk_value(v)); /* replaces a value: no allocation */
		carried++;
		u = v & PR_PRESENT_MASK;
		*units += u;
		*shmem += (v & PR_SHMEM) ? u : 0;
		*file += (v & PR_FILE) ? u : 0;
	}
	xas_unlock(&xas);
	WRITE_ONCE(t->regions_idle, t->regions_idle + carried);
	return i;
}

/**
 * pagetier_region_rewalk() - have the next pass read the page tables holding @addrs.
 * @t: the target.
 * @addrs: user addresses.
 * @nr: how many.
 *
 * Context: no lock held (takes the table's lock).
 */
void pagetier_region_rewalk(struct pagetier_target *t, const u64 *addrs, unsigned long nr)
{
	XA_STATE(xas, &t->regions, 0);
	unsigned long i, v;
	void *entry;

	xas_lock(&xas);
	for (i = 0; i < nr; i++) {
		xas_set(&xas, addrs[i] >> PMD_SHIFT);
		entry = xas_load(&xas);
		if (!xa_is_value(entry))
			continue;
		v = xa_to_value(entry);
		if (!(v & PR_REWALK))
			xas_store(&xas, xa_mk_value(v | PR_REWALK));
		if (i % 4096 == 4095) {
			xas_pause(&xas);
			xas_unlock(&xas);
			cond_resched();
			xas_lock(&xas);
		}
	}
	xas_unlock(&xas);
}

/* Forget the page entries of region @r whose generation is not @gen (all of them: @all). */
static void drop_pages(struct pagetier_target *t, unsigned long r, u8 gen, bool all)
{
	unsigned long first = r << (PMD_SHIFT - PAGE_SHIFT);
	XA_STATE(xas, &t->pages, first);
	void *entry;

	xas_lock(&xas);
	xas_for_each(&xas, entry, first + PT_REGION_PAGES - 1) {
		if (all || ((xa_to_value(entry) & PT_GEN_MASK) >> PT_GEN_SHIFT) != gen)
			xas_store(&xas, NULL);
	}
	xas_unlock(&xas);
}

/**
 * pagetier_region_drop_stale() - at the end of a pass, forget what it found unmapped.
 * @t: the target; called from its scan work only.
 *
 * A region the pass did not see is gone with all its pages; a region carried over keeps its
 * pages as they were; a region whose table was read whole had its gone pages dropped as it was
 * read (scan.c merge_table()), and one read in parts (PR_BY_GEN) loses the page entries that
 * no part stored. The work is the regions, plus the pages of the regions gone or read in parts.
 */
void pagetier_region_drop_stale(struct pagetier_target *t)
{
	XA_STATE(xas, &t->regions, 0);
	unsigned long r, v, n = 0, kept = 0;
	bool gone;
	void *entry;

	xas_lock(&xas);
	xas_for_each(&xas, entry, ULONG_MAX) {
		v = xa_to_value(entry);
		r = xas.xa_index;
		gone = region_gen(v) != t->gen;
		if (!gone) {
			kept++;
			if (!xas_get_mark(&xas, PR_BY_GEN))
				continue;
			xas_clear_mark(&xas, PR_BY_GEN);
		} else {
			xas_store(&xas, NULL);
		}
		xas_pause(&xas);
		xas_unlock(&xas);
		drop_pages(t, r, t->gen, gone);
		if (++n % 64 == 0)
			cond_resched();
		xas_lock(&xas);
	}
	xas_unlock(&xas);
	WRITE_ONCE(t->regions_tracked, kept);
}

/**
 * pagetier_region_carried() - whether the last pass that reached region @r carried it over.
 * @t: the target.
 * @r: address >> PMD_SHIFT.
 *
 * A carried-over region's upper-level Accessed bit was clear (in abit's window, or since the
 * last pass): none of its pages was seen accessed in that period, so they report no frequency,
 * whatever estimate their entries still hold from the last read of their table (which clears
 * or replaces it). Their counts stay: those are since the reset.
 *
 * Context: any; takes no lock (RCU), so it may be called under the pages' xa_lock.
 */
bool pagetier_region_carried(struct pagetier_target *t, unsigned long r)
{
	void *entry = xa_load(&t->regions, r);

	return xa_is_value(entry) && (xa_to_value(entry) & PR_IDLE);
}

/* Add up the per-page records of region @r: count, freq, pages accessed since the reset. */
static void sum_pages(struct pagetier_target *t, unsigned long r, bool carried,
		      struct pagetier_region *rec, struct pagetier_record *pages,
		      unsigned int *nr_pages)
{
	unsigned long first = r << (PMD_SHIFT - PAGE_SHIFT), v;
	XA_STATE(xas, &t->pages, first);
	u64 count = 0, freq = 0;
	void *entry;

	xas_lock(&xas);
	xas_for_each_marked(&xas, entry, first + PT_REGION_PAGES - 1, PT_ACCESSED) {
		if (!xa_is_value(entry))
			continue;
		v = xa_to_value(entry);
		count += v & PT_COUNT_MASK;
		freq += carried ? 0 : pagetier_entry_freq(t, v);
		rec->nr_accessed++;
		if (!pages)
			continue;
		/* the page list a READ_RESET takes the counts reported off */
		pages[(*nr_pages)++] = (struct pagetier_record){
			.addr = (u64)xas.xa_index << PAGE_SHIFT,
			.count = v & PT_COUNT_MASK,
		};
	}
	xas_unlock(&xas);
	rec->count = min_t(u64, count, U32_MAX);
	rec->freq = min_t(u64, freq, U32_MAX);
	if (rec->nr_accessed)
		rec->flags |= PAGETIER_REGION_ACCESSED;
}

static void fill_region(struct pagetier_target *t, unsigned long r, unsigned long v,
			struct pagetier_region *rec)
{
	unsigned long node = (v & PR_NODE_MASK) >> PR_NODE_SHIFT;
	u32 walked = (v & PR_WALKED_MASK) >> PR_WALKED_SHIFT;
	u32 last = (u32)(READ_ONCE(t->scans) - 1) & PR_WALKED_LOW;
	/* PR_WALKED_BITS-bit wrap-around difference */
	s32 idle = (s32)((last - walked) << (32 - PR_WALKED_BITS)) >> (32 - PR_WALKED_BITS);

	*rec = (struct pagetier_region){
		.addr = (u64)r << PMD_SHIFT,
		.node = node ? node - 1 : PAGETIER_NODE_NONE,
		.flags = ((v & PR_HUGE) ? PAGETIER_REGION_HUGE : 0) |
			 ((v & PR_MIXED) ? PAGETIER_REGION_MIXED : 0) |
			 ((v & PR_IDLE) ? PAGETIER_REGION_IDLE : 0) |
			 ((v & PR_SHMEM) ? PAGETIER_REGION_SHMEM : 0) |
			 ((v & PR_FILE) ? PAGETIER_REGION_FILE : 0) |
			 ((v & PR_SHARED) ? PAGETIER_REGION_SHARED : 0),
		.nr_present = v & PR_PRESENT_MASK,
		.idle_passes = idle > 0 ? idle : 0,
	};
}

/*
 * The next region from *@r on (up to @last) to report: the next in the table, or for
 * ACCESSED_ONLY the one holding the next page accessed since the reset (found through the
 * pages' marks, so that a read costs the accessed regions, not the table). *@v: its entry, 0
 * if the table has none. Return: false when there is none.
 */
static bool next_region(struct pagetier_target *t, u32 flags, unsigned long *r,
			unsigned long last, unsigned long *v)
{
	unsigned long shift = PMD_SHIFT - PAGE_SHIFT;
	void *entry;

	if (flags & PAGETIER_READ_ACCESSED_ONLY) {
		XA_STATE(xas, &t->pages, *r << shift);

		xas_lock(&xas);
		entry = xas_find_marked(&xas, (last << shift) | (PT_REGION_PAGES - 1), PT_ACCESSED);
		xas_unlock(&xas);
		if (!entry)
			return false;
		*r = xas.xa_index >> shift;
		entry = xa_load(&t->regions, *r);
	} else {
		XA_STATE(xas, &t->regions, *r);

		xas_lock(&xas);
		entry = xas_find(&xas, last);
		xas_unlock(&xas);
		if (!entry)
			return false;
		*r = xas.xa_index;
	}
	*v = xa_is_value(entry) ? xa_to_value(entry) : 0;
	return true;
}

/**
 * pagetier_regions_chunk() - up to @want region records from region index *@index on.
 * @t: the target; the caller holds t->mm_lock for read.
 * @flags: PAGETIER_READ_* (ACCESSED_ONLY: regions with a page accessed since the reset only).
 * @index: in: the first region index; out: where the next chunk starts.
 * @last: the last region index to report (at most ULONG_MAX >> (PMD_SHIFT - PAGE_SHIFT)).
 * @out: the records.
 * @want: room in @out.
 * @more: out: whether regions may remain from *@index on.
 * @pages: out: the per-page records added up (address and count), for a reset; room for
 *	   @want * PT_REGION_PAGES. NULL: not needed (no reset).
 * @nr_pages: out: how many (0 without @pages).
 *
 * The region table and the page counts are read under their own locks, one after the other
 * (never nested): a region's entry and its counts may be a scan apart.
 * Return: the number of records.
 */
unsigned int pagetier_regions_chunk(struct pagetier_target *t, u32 flags, unsigned long *index,
				    unsigned long last, struct pagetier_region *out,
				    unsigned int want, bool *more, struct pagetier_record *pages,
				    unsigned int *nr_pages)
{
	unsigned long r = *index, v;
	unsigned int n = 0, k;

	*more = false;
	*nr_pages = 0;
	while (r <= last && next_region(t, flags, &r, last, &v)) {
		if (n == want) {
			*more = true;
			break;
		}
		k = *nr_pages;
		fill_region(t, r, v, &out[n]);
		sum_pages(t, r, v & PR_IDLE, &out[n], pages, nr_pages);
		if (!(flags & PAGETIER_READ_ACCESSED_ONLY) || out[n].nr_accessed)
			n++;
		else
			*nr_pages = k; /* reset meanwhile: not reported, nothing to take off */
		if (r++ == last)
			break;
	}
	*index = r;
	return n;
}
