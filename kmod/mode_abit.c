// SPDX-License-Identifier: GPL-2.0
/*
 * abit mode: each scan tests and clears the Accessed bit of every present PTE (or huge PMD) and
 * counts the scans in which it was set. No faults; cheaper and less exact than fault mode. The
 * scan flushes the TLB for what it cleared: a cached translation does not set the bit again.
 * The scan reads only the page tables whose upper-level entries were used within a short window
 * before it (scan_window(), scan.c), as in fault mode. Frequency probes clear and test the same
 * bit over short windows.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/mm.h>

#include "pagetier.h"

static bool abit_pte(struct pagetier_target *t, struct vm_area_struct *vma, unsigned long addr,
		     pte_t *ptep, bool sample)
{
	if (pte_protnone(ptep_get(ptep)))
		return false; /* a hinting mark, not a mapping the CPU can use */
	return pagetier_young(vma, addr, PAGE_SIZE, (unsigned long *)&ptep->pte, true);
}

static bool abit_pmd(struct pagetier_target *t, struct vm_area_struct *vma, unsigned long addr,
		     pmd_t *pmdp, bool sample)
{
	if (pmd_protnone(*pmdp))
		return false;
	return pagetier_young(vma, addr, HPAGE_PMD_SIZE, (unsigned long *)pmdp, true);
}

/*
 * A probe arms by clearing the Accessed bit and tests whether the CPU (or a secondary MMU) set
 * it again.
 */
static unsigned int abit_probe_pte(struct pagetier_target *t, struct vm_area_struct *vma,
				   unsigned long addr, pte_t *ptep, bool test, bool arm)
{
	bool young;

	if (pte_protnone(ptep_get(ptep)))
		return 0;
	young = pagetier_young(vma, addr, PAGE_SIZE, (unsigned long *)&ptep->pte, arm);
	return (test && young ? PT_PROBE_HIT : 0) | (arm ? PT_PROBE_ARMED : 0);
}

static unsigned int abit_probe_pmd(struct pagetier_target *t, struct vm_area_struct *vma,
				   unsigned long addr, pmd_t *pmdp, bool test, bool arm)
{
	bool young;

	if (pmd_protnone(*pmdp))
		return 0;
	young = pagetier_young(vma, addr, HPAGE_PMD_SIZE, (unsigned long *)pmdp, arm);
	return (test && young ? PT_PROBE_HIT : 0) | (arm ? PT_PROBE_ARMED : 0);
}

const struct pagetier_mode_ops pagetier_abit_ops = {
	.name = "abit",
	.mode = PAGETIER_MODE_ABIT,
	.pte = abit_pte,
	.pmd = abit_pmd,
	.flush = true,
	.period_from_start = true,
	.probe_pte = abit_probe_pte,
	.probe_pmd = abit_probe_pmd,
};
