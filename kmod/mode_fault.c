// SPDX-License-Identifier: GPL-2.0
/*
 * fault mode: each scan marks a sample of the target's pages (anonymous, shmem and file-backed:
 * pagetier_page_kind()) inaccessible with the kernel's NUMA-hinting encoding (PROT_NONE PTE
 * bits), so that the next access takes a hinting fault, which the kernel's own fault path
 * resolves for every kind (do_numa_page and do_huge_pmd_numa_page restore the mapping, and take
 * no folio lock nor wait for writeback: the module never does either). A kretprobe on the function that path calls
 * with the faulting address (numa_migrate_prep on 6.1, numa_migrate_check from 6.10) counts the
 * fault and returns NUMA_NO_NODE so that the kernel never migrates a target's page on its own:
 * placement is the daemon's decision. Detach restores every PTE left inaccessible. As in abit
 * mode, a scan reads (counts and marks again) only the page tables whose upper-level entries
 * were used within a short window before it (scan_window(), scan.c); the marks of a table it
 * carries over stay, and their faults are counted whenever they come.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kprobes.h>
#include <linux/mm.h>
#include <linux/numa.h>
#include <linux/pgtable.h>
#include <linux/sched.h>

#include "pagetier.h"

#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 10, 0)
#define HINT_FN "numa_migrate_check"
#else
#define HINT_FN "numa_migrate_prep"
#endif

/*
 * Make a PTE of a tracked page inaccessible with the hinting encoding (page-table lock held).
 * Unlike the kernel's own marker, dirty page-cache pages are marked too: pagetier counts, the
 * daemon moves them with move_pages, which migrates dirty pages on filesystems that can.
 */
static bool mark_pte(struct vm_area_struct *vma, unsigned long addr, pte_t *ptep)
{
	pte_t old = ptep_get(ptep), new;

	if (pte_protnone(old) || pte_special(old) || pagetier_page_kind(pte_page(old), NULL) < 0)
		return false;
	/* atomically, so that no Accessed or Dirty bit set meanwhile is lost */
	old = ptep_get_and_clear(vma->vm_mm, addr, ptep);
	new = pte_modify(old, PAGE_NONE);
	if (pte_write(old))
		new = pt_pte_mkwrite(new); /* kept across PROT_NONE, as the kernel's own marker does */
	set_pte_at(vma->vm_mm, addr, ptep, new);
	return true;
}

/* The same for a huge PMD (its lock held). */
static bool mark_pmd(struct vm_area_struct *vma, unsigned long addr, pmd_t *pmdp)
{
	pmd_t old = *pmdp, new;

	/* a kind also rules out the huge zero page (no mapping) */
	if (pmd_protnone(old) || pagetier_page_kind(pmd_page(old), NULL) < 0)
		return false;
	/* never none in between: MADV_DONTNEED checks PMDs without the lock */
	old = pmdp_establish(vma, addr, pmdp, pmd_mkinvalid(old));
	new = pmd_modify(old, PAGE_NONE);
	if (pmd_write(old))
		new = pt_pmd_mkwrite(new);
	set_pmd_at(vma->vm_mm, addr, pmdp, new);
	return true;
}

static bool fault_pte(struct pagetier_target *t, struct vm_area_struct *vma, unsigned long addr,
		      pte_t *ptep, bool sample)
{
	if (sample && mark_pte(vma, addr, ptep)) {
		t->pages_marked++;
		t->marked_now++;
	}
	return false;
}

static bool fault_pmd(struct pagetier_target *t, struct vm_area_struct *vma, unsigned long addr,
		      pmd_t *pmdp, bool sample)
{
	if (sample && mark_pmd(vma, addr, pmdp)) {
		t->pages_marked++;
		t->marked_now++;
	}
	return false;
}

/*
 * Probes, two ways (sysfs probe_fault_marks). By default, as abit mode does, with the Accessed
 * bit: a unit the scan left marked is armed already, and a hinting fault restores it young; any
 * other is armed by clearing the bit. No probe then costs the target a fault. With marks, a
 * probe arms by marking the unit inaccessible, and it was accessed when its mark is gone (the
 * kernel's hinting-fault path restored it; the hook counted the fault): every window costs a
 * fault per hot unit. Either way the page table is read, not the hook's count, so that a fault
 * the hook does not see (6.1 skips the hooked call for PTE-mapped huge pages) still counts.
 */
static unsigned int fault_probe_pte(struct pagetier_target *t, struct vm_area_struct *vma,
				    unsigned long addr, pte_t *ptep, bool test, bool arm)
{
	bool marks = READ_ONCE(pagetier_probe_marks);
	pte_t pte = ptep_get(ptep);
	unsigned int ret = 0;

	if (!marks) {
		/* the CPU's bit and the secondary MMUs' (notifiers) */
		if (!pte_protnone(pte) &&
		    pagetier_young(vma, addr, PAGE_SIZE, (unsigned long *)&ptep->pte, arm) && test)
			ret |= PT_PROBE_HIT;
		return ret | (arm ? PT_PROBE_ARMED : 0);
	}
	if (test && !pte_protnone(pte))
		ret |= PT_PROBE_HIT;
	if (!arm)
		return ret;
	mark_pte(vma, addr, ptep);
	if (pte_protnone(ptep_get(ptep)))
		ret |= PT_PROBE_ARMED;
	return ret;
}

static unsigned int fault_probe_pmd(struct pagetier_target *t, struct vm_area_struct *vma,
				    unsigned long addr, pmd_t *pmdp, bool test, bool arm)
{
	bool marks = READ_ONCE(pagetier_probe_marks);
	pmd_t pmd = *pmdp;
	unsigned int ret = 0;

	if (!marks) {
		if (!pmd_protnone(pmd) &&
		    pagetier_young(vma, addr, HPAGE_PMD_SIZE, (unsigned long *)pmdp, arm) && test)
			ret |= PT_PROBE_HIT;
		return ret | (arm ? PT_PROBE_ARMED : 0);
	}
	if (test && !pmd_protnone(pmd))
		ret |= PT_PROBE_HIT;
	if (!arm)
		return ret;
	mark_pmd(vma, addr, pmdp);
	if (pmd_protnone(*pmdp))
		ret |= PT_PROBE_ARMED;
	return ret;
}

static void restore_pte(struct pagetier_walk *w, struct vm_area_struct *vma, unsigned long addr,
			pte_t *ptep)
{
	pte_t old = ptep_get(ptep), new;

	if (!pte_protnone(old))
		return;
	if (w->priv)
		(*(unsigned long *)w->priv)++;
	old = ptep_get_and_clear(vma->vm_mm, addr, ptep);
	new = pte_modify(old, vma->vm_page_prot);
	if (pte_write(old))
		new = pt_pte_mkwrite(new);
	set_pte_at(vma->vm_mm, addr, ptep, new);
}

static void restore_pmd(struct pagetier_walk *w, struct vm_area_struct *vma, unsigned long addr,
			pmd_t *pmdp)
{
	pmd_t old = *pmdp, new;

	if (!pmd_protnone(old))
		return;
	if (w->priv)
		(*(unsigned long *)w->priv)++;
	old = pmdp_establish(vma, addr, pmdp, pmd_mkinvalid(old));
	new = pmd_modify(old, vma->vm_page_prot);
	if (pmd_write(old))
		new = pt_pmd_mkwrite(new);
	set_pmd_at(vma->vm_mm, addr, pmdp, new);
}

/* Make every page of the target accessible again (mmap_lock held for read). */
static void fault_detach(struct pagetier_target *t)
{
	struct pagetier_walk w = { .pte = restore_pte, .pmd = restore_pmd, .t = t,
				   .protects = true, .restore = true };

	pagetier_walk_all(&w);
}

/* Make the pages holding @addrs accessible again (mmap_lock held for read). */
static unsigned long fault_unmark(struct pagetier_target *t, const u64 *addrs, unsigned long nr)
{
	unsigned long i, done = 0;
	struct pagetier_walk w = { .pte = restore_pte, .pmd = restore_pmd, .t = t, .priv = &done,
				   .protects = true, .restore = true };

	for (i = 0; i < nr; i++) {
		pagetier_walk_addr(&w, addrs[i]);
		if (!(i % 512))
			cond_resched();
	}
	return done;
}

const struct pagetier_mode_ops pagetier_fault_ops = {
	.name = "fault",
	.mode = PAGETIER_MODE_FAULT,
	.pte = fault_pte,
	.pmd = fault_pmd,
	.flush = true,
	.protects = true,
	.detach = fault_detach,
	.unmark = fault_unmark,
	.probe_pte = fault_probe_pte,
	.probe_pmd = fault_probe_pmd,
};

/* --- the hinting-fault hook --- */

struct hint_data {
	bool mine;
};

static int hint_entry(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	struct hint_data *d = (struct hint_data *)ri->data;
	struct pagetier_target *t;

	d->mine = false;
	if (!current->mm)
		return 1;
	rcu_read_lock();
	t = pagetier_find_mm_rcu(current->mm);
	if (t) {
		d->mine = true;
		if (t->ops->mode == PAGETIER_MODE_FAULT) {
			atomic64_inc(&t->faults);
			/* third argument: the faulting address (the PMD's start for a huge page) */
			pagetier_count_access(t, regs->dx >> PAGE_SHIFT);
		}
	}
	rcu_read_unlock();
	return d->mine ? 0 : 1; /* 1: no return handler */
}

static int hint_return(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	/* the kernel must not migrate a target's page on a hinting fault */
	regs->ax = (unsigned long)NUMA_NO_NODE;
	return 0;
}

static struct kretprobe hint_probe = {
	.kp.symbol_name = HINT_FN,
	.entry_handler = hint_entry,
	.handler = hint_return,
	.data_size = sizeof(struct hint_data),
};

/**
 * pagetier_fault_init() - hook the kernel's hinting-fault path.
 *
 * Return: 0, or the kretprobe's error after logging which function could not be probed.
 */
int pagetier_fault_init(void)
{
	int ret;

	/* called with a page-table lock held: one instance per CPU at most, plus slack */
	hint_probe.maxactive = 4 * num_possible_cpus() + 16;
	ret = register_kretprobe(&hint_probe);
	if (ret)
		pr_err("cannot load: kretprobe on %s failed (%d)\n", HINT_FN, ret);
	return ret;
}

/**
 * pagetier_fault_exit() - unhook; waits for handlers in flight.
 */
void pagetier_fault_exit(void)
{
	unregister_kretprobe(&hint_probe);
	if (hint_probe.nmissed)
		pr_warn_once("%d hinting faults missed by the probe\n", hint_probe.nmissed);
}
