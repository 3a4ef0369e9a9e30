// SPDX-License-Identifier: GPL-2.0
/*
 * Kernel functions pagetier needs but the kernel does not export to modules, looked up once at
 * load time through kallsyms_lookup_name (itself found through a kprobe's address). Every one is
 * checked; a missing one fails the load with a message naming it.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kprobes.h>
#include <linux/module.h>

#include "pagetier.h"

void (*pt_flush_tlb_mm_range)(struct mm_struct *mm, unsigned long start, unsigned long end,
			      unsigned int stride_shift, bool freed_tables);
bool (*pt_ptrace_may_access)(struct task_struct *task, unsigned int mode);
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 5, 0)
pte_t *(*pt_pte_offset_map_lock)(struct mm_struct *mm, pmd_t *pmd, unsigned long addr,
				 spinlock_t **ptlp);
#endif

#ifdef CONFIG_MMU_NOTIFIER
/* the bodies of the header's mmu_notifier_* inlines, which modules cannot link to */
int (*pt_mn_invalidate_range_start)(struct mmu_notifier_range *r);
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 6, 0)
void (*pt_mn_invalidate_range_end)(struct mmu_notifier_range *r);
#else
void (*pt_mn_invalidate_range_end)(struct mmu_notifier_range *r, bool only_end);
#endif
int (*pt_mn_clear_young)(struct mm_struct *mm, unsigned long start, unsigned long end);
int (*pt_mn_test_young)(struct mm_struct *mm, unsigned long address);
#endif

static unsigned long (*pt_kallsyms_lookup_name)(const char *name);

#ifdef CONFIG_ARCH_HAS_CC_PLATFORM
/*
 * The kernel's PTE helpers (pte_modify) read cc_mask, which is not exported; Kbuild renames
 * the header's references to this copy, filled from the kernel's value at load time.
 */
u64 cc_mask;
#endif

static int lookup(const char *name, void **fn)
{
	*fn = (void *)pt_kallsyms_lookup_name(name);
	if (!*fn) {
		pr_err("cannot load: kernel symbol %s not found\n", name);
		return -ENOENT;
	}
	return 0;
}

/**
 * pagetier_ksyms_init() - resolve every non-exported kernel function the module calls.
 *
 * Return: 0, or -ENOENT after logging the name of the first symbol that is missing.
 */
int pagetier_ksyms_init(void)
{
	struct kprobe kp = { .symbol_name = "kallsyms_lookup_name" };
	int ret;

	ret = register_kprobe(&kp);
	if (ret) {
		pr_err("cannot load: kprobe on kallsyms_lookup_name failed (%d); CONFIG_KPROBES?\n", ret);
		return ret;
	}
	pt_kallsyms_lookup_name = (void *)kp.addr;
	unregister_kprobe(&kp);
	if (!pt_kallsyms_lookup_name) {
		pr_err("cannot load: kernel symbol kallsyms_lookup_name not found\n");
		return -ENOENT;
	}
	ret = lookup("flush_tlb_mm_range", (void **)&pt_flush_tlb_mm_range);
	if (!ret)
		ret = lookup("ptrace_may_access", (void **)&pt_ptrace_may_access);
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 5, 0)
	if (!ret)
		ret = lookup("__pte_offset_map_lock", (void **)&pt_pte_offset_map_lock);
#endif
#ifdef CONFIG_MMU_NOTIFIER
	if (!ret)
		ret = lookup("__mmu_notifier_invalidate_range_start",
			     (void **)&pt_mn_invalidate_range_start);
	if (!ret)
		ret = lookup("__mmu_notifier_invalidate_range_end",
			     (void **)&pt_mn_invalidate_range_end);
	if (!ret)
		ret = lookup("__mmu_notifier_clear_young", (void **)&pt_mn_clear_young);
	if (!ret)
		ret = lookup("__mmu_notifier_test_young", (void **)&pt_mn_test_young);
#endif
#ifdef CONFIG_ARCH_HAS_CC_PLATFORM
	if (!ret) {
		u64 *kernel_cc_mask;

		ret = lookup("cc_mask", (void **)&kernel_cc_mask);
		if (!ret)
			cc_mask = *kernel_cc_mask;
	}
#endif
	return ret;
}
